// Command demo is gpusharing's main job on an embedded default: it starts a local kube-apiserver and etcd
// with the CRDs, runs the controller and simulated GPU nodes (the real agent over go-nvml's mock DGX A100
// and H100 servers, with fake nvidia-smi and nvidia-cuda-mps-control), applies the sample policies, waits
// until they converge and prints `kubectl get gpusharing -o wide`; with --dra (the default) it also lists
// the DRA devices, has the real kube-scheduler pack three sized claims onto one GPU, shows MIG
// instances created for claims and freed with their pods on a dynamic H100, and applies the pods of
// examples/pods, printing where each runs and what it got, and right-sizes a Deployment: its
// recommendation, then its namespace opted in and its new, smaller claims packed onto one GPU. Interactive by default: it stays up and
// prints a kubeconfig to use; --once exits after the last step (for CI).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrl "sigs.k8s.io/controller-runtime"
)

type options struct {
	once    bool
	timeout time.Duration
	verbose bool
	dra     bool
}

func main() {
	var o options
	flag.BoolVar(&o.once, "once", false, "exit after the converged table instead of staying up (non-zero when not converged)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long to wait for every sample policy to become Ready")
	flag.BoolVar(&o.verbose, "v", false, "show the controller's and agents' logs")
	flag.BoolVar(&o.dra, "dra", true, "the simulated nodes also publish their shares as DRA ResourceSlices, listed after the table (docs/dra.md)")
	flag.Parse()

	// The controllers log every pass; the demo's own lines are what a first-time user should read.
	log := logr.Discard()
	if o.verbose {
		log = textlogger.NewLogger(textlogger.NewConfig())
	}
	ctrl.SetLogger(log)
	klog.SetLogger(log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	say("Starting kube-apiserver and etcd (Kubernetes v1.36.3) with the gpusharing CRDs")
	c, err := startCluster()
	if err != nil {
		return err
	}
	defer c.stop()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1+len(simNodes))
	say("Starting the controller")
	if err := c.runController(ctx, errs); err != nil {
		return err
	}
	if o.dra {
		say("Installing the DRA DeviceClasses from config/dra")
		if err := c.env.ApplyDeviceClasses(ctx); err != nil {
			return err
		}
	}
	for _, n := range simNodes {
		if !o.dra {
			n.DRAPlugin = false
		}
		n.ResourceSlices = o.dra
		say("Starting simulated node %s: %d x %s, labels %v", n.Name, n.GPUs, n.Model, n.Labels)
		if err := c.runNode(ctx, n, errs); err != nil {
			return err
		}
	}
	say("Applying the sample policies from config/samples")
	names, err := c.applySamplePolicies(ctx)
	if err != nil {
		return err
	}

	waitCtx, waitCancel := context.WithTimeout(ctx, o.timeout)
	defer waitCancel()
	started := time.Now()
	converged, err := c.waitReady(waitCtx, names, errs)
	fmt.Println()
	if tableErr := c.printTable(os.Stdout); tableErr != nil {
		return tableErr
	}
	if o.dra {
		if sliceErr := c.printSlices(ctx, os.Stdout); sliceErr != nil {
			return sliceErr
		}
	}
	if err != nil {
		return err
	}
	if !converged {
		if ctx.Err() != nil {
			return nil // interrupted by the user
		}
		return fmt.Errorf("not every policy became Ready within %s; the table above says why", o.timeout)
	}
	say("All %d sample policies are Ready after %s", len(names), time.Since(started).Round(100*time.Millisecond))
	if o.dra {
		fmt.Println()
		say("Claiming 4Gi, 10Gi and 20Gi of the notebook pool's sized GPUs (DeviceClass gpusharing-sized); the real kube-scheduler allocates them")
		if err := c.scheduleSizedClaims(ctx, os.Stdout); err != nil {
			return err
		}
		fmt.Println()
		say("MIG from demand on %s: pods claim 3g.40gb, 2g.20gb and 1g.10gb (DeviceClass gpusharing-mig-dynamic); the kube-scheduler places them, the agent creates each instance", dynamicNode)
		if err := c.showDynamicMIG(ctx, os.Stdout); err != nil {
			return err
		}
		fmt.Println()
		say("The pods of %s, applied as they are; the kube-scheduler places them and each node's stand-in kubelet prepares their claims", examplesDir)
		if err := c.runExamples(ctx, os.Stdout); err != nil {
			return err
		}
		fmt.Println()
		say("Right-sizing: Deployment %s/%s's pods hold %dMi of %s claims (simulated use the agent reads); the manager recommends a size", rsNamespace, rsWorkload, rsUsedMiB, rsClaim)
		if err := c.showRightsizing(ctx, os.Stdout); err != nil {
			return err
		}
	}
	if o.once {
		return nil
	}

	fmt.Printf("\nThe cluster stays up. In another terminal:\n  export KUBECONFIG=%s\n  %s get gpusharing -o wide\n  %s edit gsp inference-mps   # change a policy and watch the nodes follow\n  %s get resourceslices        # the same shares as DRA devices (--dra)\n  %s get resourceclaims        # the sized claims, packed onto one GPU, and the MIG ones (--dra)\n  %s get pods -o wide          # the pods of examples/pods and where they run (--dra)\n  %s delete pod mig-dynamic    # its 2g.20gb instance is destroyed and its slices come back (--dra)\n  %s get gpusharerecommendations -A   # the right-sizing part's recommendation (--dra)\n  %s get gpunode %s -o wide\nCtrl-C stops and removes everything.\n",
		c.kubeconfig, c.kubectl, c.kubectl, c.kubectl, c.kubectl, c.kubectl, c.kubectl, c.kubectl, c.kubectl, dynamicNode)
	select {
	case <-ctx.Done():
	case err := <-errs:
		return err
	}
	say("Stopping")
	return nil
}

func say(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
