package rightsizing

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// countingReader fails every read, counting them: the budget test needs only to see which claims are read.
type countingReader struct {
	client.Reader
	reads int
}

var errRead = errors.New("read")

func (c *countingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	c.reads++
	return errRead
}

func TestAPassReadsAtMostItsBudgetOfNewClaims(t *testing.T) {
	rd := &countingReader{}
	r := newResolver(rd, "gpu.gpusharing.io")
	r.allow(2)
	now := time.Now()
	var deferred int
	for _, n := range []string{"a", "b", "c", "d"} {
		_, err := r.claim(context.Background(), types.NamespacedName{Namespace: "ns", Name: n}, now)
		if errors.Is(err, errDeferred) {
			deferred++
		}
	}
	if rd.reads != 2 || deferred != 2 {
		t.Errorf("reads %d, deferred %d; want 2 and 2", rd.reads, deferred)
	}
	r.allow(0)
	if _, err := r.claim(context.Background(), types.NamespacedName{Namespace: "ns", Name: "c"}, now); errors.Is(err, errDeferred) {
		t.Error("deferred with no bound")
	}
}
