package testenv

import (
	"context"
	"testing"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Objects a test changes while the operator writes them too (a policy or a GPUNode whose status the
// controllers and agents publish, a prepared claim whose device status the agent applies) may move on
// between the test's read and its write: these read again on a conflict.

// Update reads obj, applies change to it and writes it back, reading again on a conflict. It leaves the
// written object in obj.
func Update[T client.Object](t testing.TB, ctx context.Context, c client.Client, obj T, change func(T)) {
	t.Helper()
	write(t, ctx, c, obj, change, func(o client.Object) error { return c.Update(ctx, o) })
}

// UpdateStatus is Update through the status subresource.
func UpdateStatus[T client.Object](t testing.TB, ctx context.Context, c client.Client, obj T, change func(T)) {
	t.Helper()
	write(t, ctx, c, obj, change, func(o client.Object) error { return c.Status().Update(ctx, o) })
}

func write[T client.Object](t testing.TB, ctx context.Context, c client.Client, obj T, change func(T), put func(client.Object) error) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change(obj)
		return put(obj)
	})
	if err != nil {
		t.Fatalf("writing %T %s: %v", obj, client.ObjectKeyFromObject(obj), err)
	}
}
