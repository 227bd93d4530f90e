package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// validPolicySpec is a policy every case below breaks in exactly one place.
const validPolicySpec = `
priority: 10
nodeSelector: {matchLabels: {pool: inference}}
sharing:
  strategy: MPS
  mps: {replicas: 4, activeThreadPercentage: 25, pinnedMemoryLimit: 18Gi}
`

func policy(t *testing.T, name, spec string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatalf("test spec does not parse: %v", err)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpusharing.io/v1alpha1",
		"kind":       "GPUSharingPolicy",
		"metadata":   map[string]any{"name": name},
		"spec":       s,
	}}
}

func TestAcceptsTheValidBasePolicy(t *testing.T) {
	obj := policy(t, "valid-base", validPolicySpec)
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("the valid base policy was rejected, so the invalid cases below prove nothing: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
}

func TestRejectsInvalidPolicies(t *testing.T) {
	// Each case is a whole spec and the text the API server's message must contain: the field it names
	// (and, for our CEL rules, the fix it suggests).
	// The memory quantities have their own table (quantity_validation_test.go).
	cases := []struct {
		name string
		spec string
		want []string
	}{
		{"MPS strategy without an mps block", `sharing: {strategy: MPS}`,
			[]string{"sharing.mps: set it exactly when sharing.strategy is MPS"}},
		{"TimeSlicing strategy with an mps block", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, mps: {replicas: 2}}`,
			[]string{"sharing.mps: set it exactly when sharing.strategy is MPS"}},
		{"MIG strategy without a mig block", `sharing: {strategy: MIG}`,
			[]string{"sharing.mig: set it exactly when sharing.strategy is MIG"}},
		{"TimeSlicing strategy without a timeSlicing block", `sharing: {strategy: TimeSlicing}`,
			[]string{"sharing.timeSlicing: set it exactly when sharing.strategy is TimeSlicing"}},
		{"unknown strategy", `sharing: {strategy: Shared}`,
			[]string{"spec.sharing.strategy", `Unsupported value: "Shared"`}},
		{"missing sharing", `priority: 1`,
			[]string{"spec.sharing: Required value"}},
		{"MPS active thread percentage 0", `sharing: {strategy: MPS, mps: {replicas: 2, activeThreadPercentage: 0}}`,
			[]string{"spec.sharing.mps.activeThreadPercentage", "greater than or equal to 1"}},
		{"MPS active thread percentage 101", `sharing: {strategy: MPS, mps: {replicas: 2, activeThreadPercentage: 101}}`,
			[]string{"spec.sharing.mps.activeThreadPercentage", "less than or equal to 100"}},
		{"MPS zero replicas", `sharing: {strategy: MPS, mps: {replicas: 0}}`,
			[]string{"spec.sharing.mps.replicas", "greater than or equal to 1"}},
		{"MPS more replicas than MPS serves", `sharing: {strategy: MPS, mps: {replicas: 49}}`,
			[]string{"spec.sharing.mps.replicas", "less than or equal to 48"}},
		{"time-slicing with one replica", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 1}}`,
			[]string{"spec.sharing.timeSlicing.replicas", "greater than or equal to 2"}},
		{"time-slicing unknown interval", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2, interval: Tiny}}`,
			[]string{"spec.sharing.timeSlicing.interval", `Unsupported value: "Tiny"`}},
		{"MIG malformed profile", `sharing: {strategy: MIG, mig: {instances: [{profile: 3g40gb, count: 1}]}}`,
			[]string{"spec.sharing.mig.instances[0].profile", "should match"}},
		{"MIG profile with 8 slices", `sharing: {strategy: MIG, mig: {instances: [{profile: 8g.80gb, count: 1}]}}`,
			[]string{"spec.sharing.mig.instances[0].profile", "should match"}},
		{"MIG zero count", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 0}]}}`,
			[]string{"spec.sharing.mig.instances[0].count", "greater than or equal to 1"}},
		{"MIG empty instance list", `sharing: {strategy: MIG, mig: {instances: []}}`,
			[]string{"spec.sharing.mig.instances", "should have at least 1 items"}},
		{"MIG duplicate profile", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 1}, {profile: 1g.10gb, count: 2}]}}`,
			[]string{"spec.sharing.mig.instances[1]", "Duplicate value"}},
		{"MIG more than 7 instances", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 5}, {profile: 1g.20gb, count: 3}]}}`,
			[]string{"mig.instances: counts add up to more than 7 instances"}},
		{"MIG more than 7 compute slices", `sharing: {strategy: MIG, mig: {instances: [{profile: 3g.40gb, count: 2}, {profile: 2g.20gb, count: 1}]}}`,
			[]string{"mig.instances: the profiles need more than 7 compute slices"}},
		{"oversubscription with MPS", `sharing: {strategy: MPS, mps: {replicas: 2}, oversubscription: {timeQuantum: 20s}}`,
			[]string{"sharing.oversubscription: allowed only with strategy TimeSlicing or Exclusive"}},
		{"MIG with neither a layout nor dynamic instances", `sharing: {strategy: MIG, mig: {}}`,
			[]string{"mig: set instances (a fixed layout), dynamic (instances created for claims), or both"}},
		{"dynamic MIG without profiles", `sharing: {strategy: MIG, mig: {dynamic: {profiles: []}}}`,
			[]string{"spec.sharing.mig.dynamic.profiles", "should have at least 1 items"}},
		{"dynamic MIG with a malformed profile", `sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb, 3g40gb]}}}`,
			[]string{"spec.sharing.mig.dynamic.profiles[1]", "should match"}},
		{"dynamic MIG with a profile twice", `sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb, 1g.10gb]}}}`,
			[]string{"spec.sharing.mig.dynamic.profiles[1]", "Duplicate value"}},
		{"dynamic MIG beside a layout that fills the GPU", `sharing: {strategy: MIG, mig: {instances: [{profile: 4g.40gb, count: 1}, {profile: 3g.40gb, count: 1}], dynamic: {profiles: [1g.10gb]}}}`,
			[]string{"mig.dynamic: the fixed instances leave no compute slice for the smallest dynamic profile"}},
		{"dynamic MIG sized per claim", `sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb]}}, sizing: {mode: PerClaim}}`,
			[]string{"sharing.sizing: mode PerClaim is not possible with MIG"}},
		{"dynamic MIG with MPS on the same GPU", `sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb]}}, mps: {replicas: 2}}`,
			[]string{"sharing.mps: set it exactly when sharing.strategy is MPS"}},
		{"dynamic MIG with time-slicing on the same GPU", `sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb]}}, timeSlicing: {replicas: 2}}`,
			[]string{"sharing.timeSlicing: set it exactly when sharing.strategy is TimeSlicing"}},
		{"oversubscription with MIG", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 1}]}, oversubscription: {}}`,
			[]string{"sharing.oversubscription: allowed only with strategy TimeSlicing or Exclusive"}},
		{"oversubscription quantum below 1s", `sharing: {strategy: Exclusive, oversubscription: {timeQuantum: 500ms}}`,
			[]string{"spec.sharing.oversubscription.timeQuantum", "must be at least 1s"}},
		{"oversubscription unknown anti-thrashing mode", `sharing: {strategy: Exclusive, oversubscription: {antiThrashing: Sometimes}}`,
			[]string{"spec.sharing.oversubscription.antiThrashing", `Unsupported value: "Sometimes"`}},
		{"negative priority", `{priority: -1, sharing: {strategy: Exclusive}}`,
			[]string{"spec.priority", "greater than or equal to 0"}},
		{"priority above 1000", `{priority: 1001, sharing: {strategy: Exclusive}}`,
			[]string{"spec.priority", "less than or equal to 1000"}},
		{"maxUnavailable 0", `{sharing: {strategy: Exclusive}, rollout: {maxUnavailable: 0}}`,
			[]string{"spec.rollout.maxUnavailable", "must be an integer >= 1 or a percentage"}},
		{"maxUnavailable 150%", `{sharing: {strategy: Exclusive}, rollout: {maxUnavailable: "150%"}}`,
			[]string{"spec.rollout.maxUnavailable", "must be an integer >= 1 or a percentage"}},
		{"maxUnavailable a word", `{sharing: {strategy: Exclusive}, rollout: {maxUnavailable: "half"}}`,
			[]string{"spec.rollout.maxUnavailable", "must be an integer >= 1 or a percentage"}},
		{"drain unknown mode", `{sharing: {strategy: Exclusive}, rollout: {drain: {mode: Delete}}}`,
			[]string{"spec.rollout.drain.mode", `Unsupported value: "Delete"`}},
		{"drain timeout above 24h", `{sharing: {strategy: Exclusive}, rollout: {drain: {timeout: 48h}}}`,
			[]string{"spec.rollout.drain.timeout", "must be between 0s and 24h"}},
		{"node selector unknown operator", `{sharing: {strategy: Exclusive}, nodeSelector: {matchExpressions: [{key: pool, operator: Equals, values: [a]}]}}`,
			[]string{"spec.nodeSelector.matchExpressions[0].operator", `Unsupported value: "Equals"`}},
		{"node selector In without values", `{sharing: {strategy: Exclusive}, nodeSelector: {matchExpressions: [{key: pool, operator: In}]}}`,
			[]string{"spec.nodeSelector", "values must be non-empty for In and NotIn"}},
		{"node selector Exists with values", `{sharing: {strategy: Exclusive}, nodeSelector: {matchExpressions: [{key: pool, operator: Exists, values: [a]}]}}`,
			[]string{"spec.nodeSelector", "empty for Exists and DoesNotExist"}},
		{"node selector label key with a space", `{sharing: {strategy: Exclusive}, nodeSelector: {matchLabels: {"bad key": x}}}`,
			[]string{"spec.nodeSelector", "matchLabels: every key must be a valid label key"}},
		{"node selector label value too long", fmt.Sprintf(`{sharing: {strategy: Exclusive}, nodeSelector: {matchLabels: {pool: %s}}}`, strings.Repeat("a", 64)),
			[]string{"spec.nodeSelector.matchLabels.pool", "may not be more than 63 bytes"}},
		{"node selector label value with a slash", `{sharing: {strategy: Exclusive}, nodeSelector: {matchLabels: {pool: "a/b"}}}`,
			[]string{"spec.nodeSelector.matchLabels.pool", "should match"}},
		{"node selector expression key malformed", `{sharing: {strategy: Exclusive}, nodeSelector: {matchExpressions: [{key: "-pool", operator: Exists}]}}`,
			[]string{"spec.nodeSelector.matchExpressions[0].key", "should match"}},
		{"GPU selector with two kinds of keys", `{sharing: {strategy: Exclusive}, gpus: {products: [A100], indices: [0]}}`,
			[]string{"spec.gpus", "set exactly one of products, indices or uuids"}},
		{"GPU selector that is empty", `{sharing: {strategy: Exclusive}, gpus: {}}`,
			[]string{"spec.gpus", "set exactly one of products, indices or uuids"}},
		{"GPU index out of range", `{sharing: {strategy: Exclusive}, gpus: {indices: [64]}}`,
			[]string{"spec.gpus.indices[0]", "less than or equal to 63"}},
		{"GPU uuid malformed", `{sharing: {strategy: Exclusive}, gpus: {uuids: [not-a-uuid]}}`,
			[]string{"spec.gpus.uuids[0]", "should match"}},
		{"per-claim sizing with MIG", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 1}]}, sizing: {mode: PerClaim}}`,
			[]string{"sharing.sizing: mode PerClaim is not possible with MIG"}},
		{"per-claim sizing on time-slicing without the shim", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, sizing: {mode: PerClaim}}`,
			[]string{"sharing.sizing: mode PerClaim needs something that enforces each claim's size"}},
		{"per-claim sizing on a whole GPU without the shim", `sharing: {strategy: Exclusive, sizing: {mode: PerClaim}}`,
			[]string{"sharing.sizing: mode PerClaim needs something that enforces each claim's size"}},
		{"per-claim sizing with the policy's MPS thread percentage", `sharing: {strategy: MPS, mps: {replicas: 4, activeThreadPercentage: 25}, sizing: {mode: PerClaim}}`,
			[]string{"sharing.mps: leave activeThreadPercentage and pinnedMemoryLimit unset with sizing PerClaim"}},
		{"per-claim sizing with the policy's MPS pinned memory limit", `sharing: {strategy: MPS, mps: {replicas: 4, pinnedMemoryLimit: 10Gi}, sizing: {mode: PerClaim}}`,
			[]string{"sharing.mps: leave activeThreadPercentage and pinnedMemoryLimit unset with sizing PerClaim"}},
		{"unknown sizing mode", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: Elastic}}`,
			[]string{"spec.sharing.sizing.mode", `Unsupported value: "Elastic"`}},
		{"memory step with fixed sizing", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {memoryStep: 1Gi}}`,
			[]string{"sizing: memoryStep, minMemory and onExceed apply only to mode PerClaim"}},
		{"minimum memory with fixed sizing", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: Fixed, minMemory: 4Gi}}`,
			[]string{"sizing: memoryStep, minMemory and onExceed apply only to mode PerClaim"}},
		{"an action on exceeding claims with fixed sizing", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {onExceed: Evict}}`,
			[]string{"sizing: memoryStep, minMemory and onExceed apply only to mode PerClaim"}},
		{"unknown action on exceeding claims", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim, onExceed: Kill}}`,
			[]string{"spec.sharing.sizing.onExceed", `Unsupported value: "Kill"`}},
		{"production classes on plain time-slicing", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, qos: {productionPriority: 1000}}`,
			[]string{"sharing.qos: needs something that can favour production"}},
		{"production classes on a whole GPU without the shim", `sharing: {strategy: Exclusive, qos: {productionPriority: 1000}}`,
			[]string{"sharing.qos: needs something that can favour production"}},
		{"production classes with MIG", `sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 1}]}, qos: {productionPriority: 1000}}`,
			[]string{"sharing.qos: needs something that can favour production"}},
		{"an opportunistic thread cap without MPS", `sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticThreadPercentage: 30}}`,
			[]string{"sharing.qos.opportunisticThreadPercentage: applies only to strategy MPS"}},
		{"an opportunistic launch queue without the shim", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 1000, opportunisticQueue: 8}}`,
			[]string{"sharing.qos.opportunisticQueue: applies only with oversubscription"}},
		{"an unmanaged-process action on plain time-slicing", `sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, unmanagedProcesses: Evict}`,
			[]string{"sharing.unmanagedProcesses: applies only with oversubscription"}},
		{"an unmanaged-process action on MPS of fixed shares", `sharing: {strategy: MPS, mps: {replicas: 2}, unmanagedProcesses: Report}`,
			[]string{"sharing.unmanagedProcesses: applies only with oversubscription"}},
		{"an unknown unmanaged-process action", `sharing: {strategy: Exclusive, oversubscription: {}, unmanagedProcesses: Kill}`,
			[]string{"spec.sharing.unmanagedProcesses", "Unsupported value"}},
		{"production classes without a threshold", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {}}`,
			[]string{"spec.sharing.qos.productionPriority", "Required value"}},
		{"an opportunistic queue time without the shim", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 1000, opportunisticQueueTime: 500us}}`,
			[]string{"sharing.qos.opportunisticQueueTime: applies only with oversubscription"}},
		{"an opportunistic queue time past 100ms", `sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueueTime: 200ms}}`,
			[]string{"qos.opportunisticQueueTime: must be from 0s (the bound in launches alone) to 100ms"}},
		{"a negative opportunistic queue time", `sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueueTime: -1ms}}`,
			[]string{"qos.opportunisticQueueTime: must be from 0s"}},
		{"a settle floor without the shim", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 1000, settleFloor: 100us}}`,
			[]string{"sharing.qos.settleFloor: applies only with oversubscription"}},
		{"a settle floor past 1ms", `sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, settleFloor: 2ms}}`,
			[]string{"qos.settleFloor: must be from 0s (no release on completion: the idle window alone) to 1ms"}},
		{"an empty opportunistic launch queue", `sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueue: 0}}`,
			[]string{"spec.sharing.qos.opportunisticQueue", "should be greater than or equal to 1"}},
		{"a production threshold every pod without a PriorityClass meets", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 0}}`,
			[]string{"spec.sharing.qos.productionPriority", "qos.productionPriority: must be from 1000 to 1000000000", "pods without a PriorityClass have priority 0"}},
		{"a production threshold below 1000", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 999}}`,
			[]string{"spec.sharing.qos.productionPriority", "qos.productionPriority: must be from 1000 to 1000000000"}},
		{"a negative production threshold", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: -5}}`,
			[]string{"spec.sharing.qos.productionPriority", "qos.productionPriority: must be from 1000 to 1000000000"}},
		{"a production threshold only system classes reach", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 1000000001}}`,
			[]string{"spec.sharing.qos.productionPriority", "qos.productionPriority: must be from 1000 to 1000000000"}},
		{"an opportunistic thread cap over 100", `sharing: {strategy: MPS, mps: {replicas: 2}, qos: {productionPriority: 1000, opportunisticThreadPercentage: 101}}`,
			[]string{"spec.sharing.qos.opportunisticThreadPercentage", "should be less than or equal to 100"}},
	}
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := policy(t, fmt.Sprintf("invalid-%d", i), tc.spec)
			err := env.Client.Create(ctx, obj)
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
				t.Fatalf("accepted, want rejected with %q", tc.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("rejected, but not as invalid: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestAcceptsSizingWhereSomethingEnforcesIt(t *testing.T) {
	ctx := context.Background()
	for i, spec := range []string{
		`sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim}}`,
		`sharing: {strategy: MPS, mps: {replicas: 8}, sizing: {mode: PerClaim, memoryStep: 512Mi, minMemory: 2Gi}}`,
		`sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 4}, oversubscription: {}, sizing: {mode: PerClaim, minMemory: 4Gi}}`,
		`sharing: {strategy: Exclusive, oversubscription: {}, sizing: {mode: PerClaim}}`,
		// Fixed is today's sizing, with every strategy; a step larger than any GPU is the agent's to refuse.
		`sharing: {strategy: MIG, mig: {instances: [{profile: 1g.10gb, count: 1}]}, sizing: {mode: Fixed}}`,
		`sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim, memoryStep: 1Ti}}`,
	} {
		obj := policy(t, fmt.Sprintf("sized-%d", i), spec)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: rejected: %v", spec, err)
			continue
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

func TestAcceptsDynamicMIG(t *testing.T) {
	ctx := context.Background()
	for i, spec := range []string{
		`sharing: {strategy: MIG, mig: {dynamic: {profiles: [1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb]}}}`,
		`sharing: {strategy: MIG, mig: {instances: [{profile: 3g.40gb, count: 1}], dynamic: {profiles: [1g.10gb, 3g.40gb]}}}`,
		`sharing: {strategy: MIG, mig: {instances: [{profile: 4g.40gb, count: 1}, {profile: 2g.20gb, count: 1}], dynamic: {profiles: [1g.10gb+me]}}}`,
	} {
		obj := policy(t, fmt.Sprintf("dynmig-%d", i), spec)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: rejected: %v", spec, err)
			continue
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

func TestAcceptsProductionClassesWhereSomethingFavoursProduction(t *testing.T) {
	ctx := context.Background()
	for i, spec := range []string{
		`sharing: {strategy: MPS, mps: {replicas: 4}, qos: {productionPriority: 1000}}`,
		`sharing: {strategy: MPS, mps: {replicas: 4}, qos: {productionPriority: 1000000000, opportunisticThreadPercentage: 30}}`,
		`sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueue: 4}}`,
		`sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueueTime: 300us}}`,
		`sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, opportunisticQueueTime: 0s}}`,
		`sharing: {strategy: Exclusive, oversubscription: {}, qos: {productionPriority: 1000, settleFloor: 0s, opportunisticQueueTime: 0s}}`,
		`sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, oversubscription: {antiThrashing: Always}, qos: {productionPriority: 1000000}}`,
		`sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim}, qos: {productionPriority: 1000}}`,
	} {
		obj := policy(t, fmt.Sprintf("qos-%d", i), spec)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: rejected: %v", spec, err)
			continue
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

func TestAcceptsAnUnmanagedProcessActionWhereSomethingManagesTheProcesses(t *testing.T) {
	ctx := context.Background()
	for i, spec := range []string{
		`sharing: {strategy: Exclusive, oversubscription: {}, unmanagedProcesses: Evict}`,
		`sharing: {strategy: TimeSlicing, timeSlicing: {replicas: 2}, oversubscription: {}, unmanagedProcesses: Report}`,
		`sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim}, unmanagedProcesses: Evict}`,
	} {
		obj := policy(t, fmt.Sprintf("unmanaged-%d", i), spec)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: rejected: %v", spec, err)
			continue
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

func TestRejectsGPUNodeEntryWithoutUUID(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpusharing.io/v1alpha1",
		"kind":       "GPUNode",
		"metadata":   map[string]any{"name": "node-without-uuid"},
		"spec": map[string]any{"gpus": []any{map[string]any{
			"index": int64(0), "sharing": map[string]any{"strategy": "Exclusive"},
		}}},
	}}
	err := env.Client.Create(context.Background(), obj)
	if err == nil {
		t.Fatal("accepted a GPU entry without uuid")
	}
	if !strings.Contains(err.Error(), "spec.gpus[0].uuid") {
		t.Errorf("message does not name spec.gpus[0].uuid: %v", err)
	}
}

// gpuNodeWithGPUs is a GPUNode whose spec lists the given uuids.
func gpuNodeWithGPUs(name string, uuids ...string) *unstructured.Unstructured {
	gpus := make([]any, len(uuids))
	for i, u := range uuids {
		gpus[i] = map[string]any{"uuid": u, "index": int64(i), "sharing": map[string]any{"strategy": "Exclusive"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpusharing.io/v1alpha1",
		"kind":       "GPUNode",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"gpus": gpus},
	}}
}

func TestRejectsAGPUListedTwice(t *testing.T) {
	ctx := context.Background()
	err := env.Client.Create(ctx, gpuNodeWithGPUs("gpu-twice-in-spec", "GPU-a", "GPU-b", "GPU-a"))
	if err == nil || !strings.Contains(err.Error(), "spec.gpus: Invalid value") || !strings.Contains(err.Error(), "each GPU uuid may be listed once") {
		t.Fatalf("a spec listing GPU-a twice: want the uniqueness rule's message on spec.gpus, got %v", err)
	}

	obj := gpuNodeWithGPUs("gpu-twice-in-status", "GPU-a")
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	status := []any{
		map[string]any{"uuid": "GPU-a", "index": int64(0)},
		map[string]any{"uuid": "GPU-a", "index": int64(1)},
	}
	if err := unstructured.SetNestedSlice(obj.Object, status, "status", "gpus"); err != nil {
		t.Fatal(err)
	}
	err = env.Client.Status().Update(ctx, obj)
	if err == nil || !strings.Contains(err.Error(), "status.gpus: Invalid value") || !strings.Contains(err.Error(), "each GPU uuid may be listed once") {
		t.Fatalf("a status listing GPU-a twice: want the uniqueness rule's message on status.gpus, got %v", err)
	}
}

// The GPU lists are atomic (one writer each, always written whole): their managedFields entry is the
// list, not every field of every GPU, which on a node of 8 GPUs was more than half of the object that the
// API server decodes, diffs and encodes on every write.
func TestGPUListsAreOwnedWhole(t *testing.T) {
	ctx := context.Background()
	obj := gpuNodeWithGPUs("gpu-lists-owned-whole", "GPU-a", "GPU-b")
	if err := env.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, obj) })
	status := []any{map[string]any{"uuid": "GPU-a", "index": int64(0)}, map[string]any{"uuid": "GPU-b", "index": int64(1)}}
	if err := unstructured.SetNestedSlice(obj.Object, status, "status", "gpus"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Status().Update(ctx, obj); err != nil {
		t.Fatal(err)
	}
	for _, mf := range obj.GetManagedFields() {
		fields := mf.FieldsV1.GetRawString()
		if strings.Contains(fields, `k:{\"uuid\"`) {
			t.Errorf("managedFields of %s (%s) list each GPU: %s", mf.Manager, mf.Subresource, fields)
		}
		if !strings.Contains(fields, `"f:gpus":{}`) {
			t.Errorf("managedFields of %s (%s) do not own the GPU list whole: %s", mf.Manager, mf.Subresource, fields)
		}
	}
}
