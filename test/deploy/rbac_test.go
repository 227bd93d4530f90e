package deploy

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// reviewed lists every permission each component's generated ClusterRole may hold, as group/resource:verb,
// each with the call that needs it. A new +kubebuilder:rbac marker fails this test until someone reviews
// it here, so the roles never grow by accident.
var reviewed = map[string]map[string]string{
	"manager": {
		"/nodes:get":                                          "the resolver reads Node labels",
		"/nodes:list":                                         "the resolver's informer",
		"/nodes:watch":                                        "relabelling a node moves its GPUs between policies",
		"events.k8s.io/events:create":                         "condition transitions on policies",
		"events.k8s.io/events:patch":                          "repeated events are aggregated",
		"gpusharing.io/gpunodes:get":                          "the resolver reads inventory from status",
		"gpusharing.io/gpunodes:list":                         "informer",
		"gpusharing.io/gpunodes:watch":                        "agents' status changes drive rollout and policy status",
		"gpusharing.io/gpunodes:update":                       "the resolver writes spec",
		"gpusharing.io/gpunodes:patch":                        "the resolver writes spec",
		"gpusharing.io/gpunodes:delete":                       "a GPUNode whose Node is gone is cleaned up (no garbage collector in envtest)",
		"gpusharing.io/gpusharingpolicies:get":                "reconcile",
		"gpusharing.io/gpusharingpolicies:list":               "informer",
		"gpusharing.io/gpusharingpolicies:watch":              "informer",
		"gpusharing.io/gpusharingpolicies:update":             "the restore-default finalizer",
		"gpusharing.io/gpusharingpolicies:patch":              "the restore-default finalizer",
		"gpusharing.io/gpusharingpolicies/finalizers:update":  "owner references need it under OwnerReferencesPermissionEnforcement",
		"gpusharing.io/gpusharingpolicies/status:get":         "status subresource",
		"gpusharing.io/gpusharingpolicies/status:update":      "the one status write per pass",
		"gpusharing.io/gpusharingpolicies/status:patch":       "the one status write per pass",
		"authentication.k8s.io/tokenreviews:create":           "the metrics endpoint reviews each scraper's token (internal/metricsauth)",
		"authorization.k8s.io/subjectaccessreviews:create":    "the metrics endpoint asks whether the scraper may get /metrics (internal/metricsauth)",
		"gpusharing.io/gpusharerecommendations:get":           "right-sizing reads a workload's recommendation (its checkpointed history) from the cache",
		"gpusharing.io/gpusharerecommendations:list":          "informer",
		"gpusharing.io/gpusharerecommendations:watch":         "informer",
		"gpusharing.io/gpusharerecommendations:create":        "right-sizing creates one per workload and sized request it sees",
		"gpusharing.io/gpusharerecommendations:update":        "generated with create; the spec is written once",
		"gpusharing.io/gpusharerecommendations:patch":         "generated with create; the spec is written once",
		"gpusharing.io/gpusharerecommendations/status:get":    "status subresource",
		"gpusharing.io/gpusharerecommendations/status:update": "the recommendation and its history",
		"gpusharing.io/gpusharerecommendations/status:patch":  "status subresource",
		"resource.k8s.io/resourceclaims:get":                  "right-sizing reads a sized claim once: its owner pod, pod claim name and request",
		"/pods:get":                                           "right-sizing reads a claim's pod once for its owner (uncached)",
		"/namespaces:get":                                     "right-sizing reads the namespace's opt-in label and bounds",
		"/namespaces:list":                                    "informer",
		"/namespaces:watch":                                   "informer",
		"apps/replicasets:get":                                "right-sizing follows a pod's ReplicaSet to its Deployment (uncached, once per ReplicaSet)",
		"apps/deployments:get":                                "right-sizing reads the workload's opt-in annotation and UID (metadata only)",
		"apps/deployments:list":                               "metadata informer",
		"apps/deployments:watch":                              "metadata informer",
		"apps/statefulsets:get":                               "right-sizing reads the workload's opt-in annotation and UID (metadata only)",
		"apps/statefulsets:list":                              "metadata informer",
		"apps/statefulsets:watch":                             "metadata informer",
		"apps/daemonsets:get":                                 "right-sizing reads the workload's opt-in annotation and UID (metadata only)",
		"apps/daemonsets:list":                                "metadata informer",
		"apps/daemonsets:watch":                               "metadata informer",
		"batch/jobs:get":                                      "right-sizing follows a pod's Job to its CronJob (uncached, once per Job)",
		"batch/cronjobs:get":                                  "right-sizing reads the workload's opt-in annotation and UID (metadata only)",
		"batch/cronjobs:list":                                 "metadata informer",
		"batch/cronjobs:watch":                                "metadata informer",
	},
	"agent": {
		"/nodes:get":                                       "the agent's GPUNode is owned by its Node",
		"/nodes:list":                                      "its cache holds only its own Node (field selector on metadata.name)",
		"/nodes:watch":                                     "its cache holds only its own Node (field selector on metadata.name)",
		"/pods:get":                                        "the drain checks whether a pod from PodResources still runs",
		"/pods:list":                                       "the drain lists the pods on the GPU",
		"/pods/eviction:create":                            "Evict drain mode, through the eviction API so PDBs hold; config/admission admits only pods bound to its node",
		"events.k8s.io/events:create":                      "per-GPU Applied transitions; ResourceSlice publishing failing and working again",
		"events.k8s.io/events:patch":                       "repeated events are aggregated",
		"gpusharing.io/gpunodes:get":                       "its own GPUNode",
		"gpusharing.io/gpunodes:list":                      "informer restricted to its own name",
		"gpusharing.io/gpunodes:watch":                     "spec changes from the controller",
		"gpusharing.io/gpunodes:create":                    "the first pass creates the GPUNode",
		"gpusharing.io/gpunodes/status:update":             "the one status write per pass",
		"authentication.k8s.io/tokenreviews:create":        "the metrics endpoint reviews each scraper's token (internal/metricsauth)",
		"authorization.k8s.io/subjectaccessreviews:create": "the metrics endpoint asks whether the scraper may get /metrics (internal/metricsauth)",
	},
	// Bound only where the agents serve DRA (config/dra, the chart's agent.deviceInterface DRA or Both).
	"agent-dra": {
		"resource.k8s.io/deviceclasses:list":    "--dra beside the device plugin: which extended resources the DeviceClasses serve through DRA, left to it",
		"resource.k8s.io/deviceclasses:watch":   "--dra beside the device plugin: the same names as classes come and go",
		"resource.k8s.io/resourceslices:list":   "--dra-resource-slices: the ResourceSlice controller's informer on its node's slices (field selectors spec.nodeName, spec.driver)",
		"resource.k8s.io/resourceslices:watch":  "--dra-resource-slices: the same informer, which puts back a slice someone else changed or deleted",
		"resource.k8s.io/resourceslices:create": "--dra-resource-slices: a node's first slices, and one deleted by someone else",
		"resource.k8s.io/resourceslices:update": "--dra-resource-slices: the devices changed",
		"resource.k8s.io/resourceslices:delete": "--dra-resource-slices: slices past the new count, or of an older generation",
		"resource.k8s.io/resourceclaims:get":    "--dra: the kubelet plugin reads the claims the kubelet asks it to prepare",
		"resource.k8s.io/resourceclaims:list":   "--dra: the drain finds the pods holding claims on a GPU (read uncached, paged)",
		"resource.k8s.io/resourceclaims/status:patch": "--dra: each prepared sized claim's use in its device status (status.devices[].data), " +
			"rate limited; no admission policy narrows it to the node's claims yet (docs/security.md)",
		"resource.k8s.io/resourceclaims/driver[gpu.gpusharing.io]:associated-node:patch": "--dra: Kubernetes 1.36 takes device " +
			"status from a driver only with this verb for its own name, for claims allocated on the token's node",
	},
}

func grants(t *testing.T, component string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.RepoRoot, "config", "rbac", component, "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("%s: rule %v names URLs; extend this test to review it", component, r)
		}
		// A rule narrowed by name is reviewed per name: group/resource[name]:verb.
		names := []string{""}
		if len(r.ResourceNames) > 0 {
			names = nil
			for _, n := range r.ResourceNames {
				names = append(names, "["+n+"]")
			}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, n := range names {
					for _, v := range r.Verbs {
						out = append(out, g+"/"+res+n+":"+v)
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestEachRoleGrantsExactlyTheReviewedRules(t *testing.T) {
	for component, want := range reviewed {
		t.Run(component, func(t *testing.T) {
			got := map[string]bool{}
			for _, g := range grants(t, component) {
				got[g] = true
				if _, ok := want[g]; !ok {
					t.Errorf("config/rbac/%s grants %s, which nobody reviewed: remove its +kubebuilder:rbac marker or add it to this test with the call that needs it", component, g)
				}
			}
			var missing []string
			for g := range want {
				if !got[g] {
					missing = append(missing, g)
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("config/rbac/%s no longer grants %s: drop them from the reviewed list", component, strings.Join(missing, ", "))
			}
		})
	}
}
