package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
)

// quantityField is one memory quantity of the API: the spec it sits in (with %s where the value goes)
// and how the agent reads the admitted value, in bytes.
type quantityField struct {
	name  string
	spec  string
	bytes func(*v1.Sharing) int64
}

var quantityFields = []quantityField{
	{"sizing.memoryStep", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim, memoryStep: %s}}`,
		func(s *v1.Sharing) int64 { return s.Sizing.Step() }},
	{"sizing.minMemory", `sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim, memoryStep: 512Mi, minMemory: %s}}`,
		func(s *v1.Sharing) int64 { return s.Sizing.Min() }},
	{"mps.pinnedMemoryLimit", `sharing: {strategy: MPS, mps: {replicas: 4, pinnedMemoryLimit: %s}}`,
		func(s *v1.Sharing) int64 { return s.MPS.PinnedMemoryLimit.Value() }},
	{"oversubscription.memoryBudget", `sharing: {strategy: Exclusive, oversubscription: {memoryBudget: %s}}`,
		func(s *v1.Sharing) int64 { return s.Oversubscription.MemoryBudget.Value() }},
}

func fieldNamed(t *testing.T, name string) quantityField {
	t.Helper()
	for _, f := range quantityFields {
		if f.name == name {
			return f
		}
	}
	t.Fatalf("no quantity field %s", name)
	return quantityField{}
}

// Every memory quantity is judged by its value, whatever its spelling: a decimal point, a bare integer
// (an int in the API server's CEL, the fields being int-or-string) or a quoted one. What the API server
// admits, the agent reads as the same number of bytes.
func TestAcceptsMemoryQuantitiesByValueNotSpelling(t *testing.T) {
	const mi = 1 << 20
	spellings := []struct {
		yaml  string
		bytes int64
	}{
		{"1536Mi", 1536 * mi},
		{"1.5Gi", 1536 * mi},
		{"1610612736", 1536 * mi},
		{`"1610612736"`, 1536 * mi},
		{"0.5Gi", 512 * mi},
		{"2.5Gi", 2560 * mi},
		{"1.3Gi", 1395864372}, // 1395864371.2 bytes: the agent rounds up to a whole byte
		{"1.5e9", 1_500_000_000},
		{"3Gi", 3072 * mi},
		{"64Ti", 64 << 40},
	}
	ctx := context.Background()
	for _, f := range quantityFields {
		for i, s := range spellings {
			want := s.bytes
			// memoryStep must be a whole number of MiB and minMemory a multiple of the 512Mi step:
			// values that are not are refused, in the test below.
			if (f.name == "sizing.memoryStep" && want%mi != 0) || (f.name == "sizing.minMemory" && want%(512*mi) != 0) {
				continue
			}
			t.Run(f.name+"="+s.yaml, func(t *testing.T) {
				obj := policy(t, fmt.Sprintf("qty-%s-%d", strings.ToLower(strings.ReplaceAll(f.name, ".", "-")), i), fmt.Sprintf(f.spec, s.yaml))
				if err := env.Client.Create(ctx, obj); err != nil {
					t.Fatalf("refused: %v", err)
				}
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
				var got v1.GPUSharingPolicy
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), &got); err != nil {
					t.Fatal(err)
				}
				if b := f.bytes(&got.Spec.Sharing); b != want {
					t.Errorf("the agent reads %d bytes, want %d", b, want)
				}
			})
		}
	}
}

func TestRejectsMemoryQuantitiesWithAMessageToActOn(t *testing.T) {
	cases := []struct {
		field, value string
		want         []string
	}{
		{"sizing.memoryStep", "1.3Gi", []string{"sizing.memoryStep: 1.3Gi is not a whole number of MiB", "such as 512Mi, 1536Mi or 1.5Gi"}},
		{"sizing.memoryStep", "1000Ki", []string{"sizing.memoryStep: 1000Ki", "at least 1Mi"}},
		{"sizing.memoryStep", `"1.5e9"`, []string{"sizing.memoryStep: 1.5e9 is not a whole number of MiB"}},
		{"sizing.memoryStep", "1500000000", []string{"sizing.memoryStep: 1500000000 is not a whole number of MiB"}},
		{"sizing.memoryStep", "-1Gi", []string{"sizing.memoryStep: -1Gi", "at least 1Mi"}},
		{"sizing.memoryStep", "0", []string{"sizing.memoryStep: 0", "at least 1Mi"}},
		{"sizing.memoryStep", `"0"`, []string{"sizing.memoryStep: 0", "at least 1Mi"}},
		{"sizing.memoryStep", "-1610612736", []string{"sizing.memoryStep: -1610612736", "at least 1Mi"}},
		{"sizing.memoryStep", "65Ti", []string{"sizing.memoryStep: 65Ti", "at most 64Ti"}},
		{"sizing.memoryStep", `"1e30"`, []string{"sizing.memoryStep: 1e30", "at most 64Ti"}},
		// A bare number that is no integer fails the schema's type before any rule runs.
		{"sizing.memoryStep", "1.5", []string{"spec.sharing.sizing.memoryStep", "must be of type integer,string"}},
		{"sizing.memoryStep", "lots", []string{"sizing.memoryStep: must be a quantity of bytes"}},
		{"sizing.minMemory", "2.3Gi", []string{"sizing.minMemory: 2.3Gi is not a multiple of memoryStep 512Mi", "round it to one"}},
		{"sizing.minMemory", "1.3Gi", []string{"sizing.minMemory: 1.3Gi is not a multiple of memoryStep 512Mi", "round it to one"}},
		{"sizing.minMemory", "256Mi", []string{"sizing.minMemory: 256Mi is not a multiple of memoryStep 512Mi", "round it to one"}},
		{"sizing.minMemory", "0", []string{"sizing.minMemory: 0", "at least 1Mi"}},
		{"sizing.minMemory", "-1Gi", []string{"sizing.minMemory: -1Gi", "at least 1Mi"}},
		{"sizing.minMemory", "lots", []string{"sizing.minMemory: must be a quantity of bytes"}},
		{"mps.pinnedMemoryLimit", "0", []string{"mps.pinnedMemoryLimit: 0", "at least 1Mi"}},
		{"mps.pinnedMemoryLimit", "512Ki", []string{"mps.pinnedMemoryLimit: 512Ki", "at least 1Mi"}},
		{"mps.pinnedMemoryLimit", "-1Gi", []string{"mps.pinnedMemoryLimit: -1Gi", "at least 1Mi"}},
		{"mps.pinnedMemoryLimit", "65Ti", []string{"mps.pinnedMemoryLimit: 65Ti", "at most 64Ti"}},
		{"mps.pinnedMemoryLimit", "lots", []string{"mps.pinnedMemoryLimit: must be a quantity of bytes"}},
		{"oversubscription.memoryBudget", "0", []string{"oversubscription.memoryBudget: 0", "at least 1Mi"}},
		{"oversubscription.memoryBudget", "0.5Mi", []string{"oversubscription.memoryBudget: 0.5Mi", "at least 1Mi"}},
		{"oversubscription.memoryBudget", "-1", []string{"oversubscription.memoryBudget: -1", "at least 1Mi"}},
		{"oversubscription.memoryBudget", `"1e30"`, []string{"oversubscription.memoryBudget: 1e30", "at most 64Ti"}},
	}
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.field+"="+tc.value, func(t *testing.T) {
			f := fieldNamed(t, tc.field)
			obj := policy(t, fmt.Sprintf("qty-invalid-%d", i), fmt.Sprintf(f.spec, tc.value))
			err := env.Client.Create(ctx, obj)
			if err == nil {
				_ = env.Client.Delete(ctx, obj)
				t.Fatalf("accepted, want refused with %q", tc.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("refused, but not as invalid: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message does not contain %q:\n%v", w, err)
				}
			}
			// An internal error of a rule is no message a user can act on.
			for _, bad := range []string{"no such overload", "no matching overload", "evaluation error", "cannot convert"} {
				if strings.Contains(err.Error(), bad) {
					t.Errorf("message carries a rule's internal error %q:\n%v", bad, err)
				}
			}
		})
	}
}

// The default step (1Gi) judges minMemory when memoryStep is omitted, whatever minMemory's spelling.
func TestMinMemoryAgainstTheDefaultStep(t *testing.T) {
	ctx := context.Background()
	for i, tc := range []struct {
		value string
		ok    bool
	}{
		{"2Gi", true}, {"2.0Gi", true}, {"2147483648", true}, {"2048Mi", true},
		{"2.5Gi", false}, {"1536Mi", false},
	} {
		obj := policy(t, fmt.Sprintf("qty-default-step-%d", i),
			fmt.Sprintf(`sharing: {strategy: MPS, mps: {replicas: 4}, sizing: {mode: PerClaim, minMemory: %s}}`, tc.value))
		err := env.Client.Create(ctx, obj)
		if err == nil {
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
		}
		switch {
		case tc.ok && err != nil:
			t.Errorf("minMemory %s with the default step: refused: %v", tc.value, err)
		case !tc.ok && err == nil:
			t.Errorf("minMemory %s with the default step: accepted", tc.value)
		case !tc.ok && !strings.Contains(err.Error(), "is not a multiple of memoryStep 1Gi"):
			t.Errorf("minMemory %s with the default step: message does not name the default step:\n%v", tc.value, err)
		}
	}
}
