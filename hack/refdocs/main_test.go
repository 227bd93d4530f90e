package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repo is the configuration make generate runs with, from this package's directory.
func repo() config {
	return config{
		root: "../..", api: "api/v1alpha1", group: "gpusharing.io/v1alpha1", out: "docs/reference",
		shimSrc: "shim/src", shimDoc: "docs/shim.md", docs: "docs/*.md",
		kinds: []string{"GPUSharingPolicy", "GPUNode", "GPUShareRecommendation"}, reasonRoots: []string{"api", "agent", "controllers"},
	}
}

func TestTheCommittedReferenceIsCompleteAndCurrent(t *testing.T) {
	c := repo()
	files, faults, err := generate(c)
	if err != nil {
		t.Fatal(err)
	}
	faults = append(faults, stale(c, files)...)
	for _, f := range faults {
		t.Error(f)
	}
}

// plantedAPI copies the API package's source into a temporary repository, applies edit to the file
// named, and returns a configuration over it.
func plantedAPI(t *testing.T, file string, edit func(string) string) config {
	t.Helper()
	c := repo()
	src := filepath.Join(c.root, c.api)
	c.root, c.shimSrc, c.docs = t.TempDir(), "", ""
	dst := filepath.Join(c.root, c.api)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == file {
			found = true
			edited := edit(string(b))
			if edited == string(b) {
				t.Fatalf("planting into %s changed nothing", file)
			}
			b = []byte(edited)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("no %s in %s", file, src)
	}
	c.reasonRoots = []string{"api"}
	return c
}

// wantFault runs the generator over c and wants exactly one fault, containing want.
func wantFault(t *testing.T, c config, want string) {
	t.Helper()
	_, faults, err := generate(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(faults) != 1 || !strings.Contains(faults[0], want) {
		t.Errorf("faults = %q, want one containing %q", faults, want)
	}
	if err := run(c, false); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("run = %v, want a failure naming %q", err, want)
	}
	if _, err := os.Stat(filepath.Join(c.root, c.out)); err == nil {
		t.Errorf("a failed run wrote %s", c.out)
	}
}

func TestAReasonWithoutWhatToDoFails(t *testing.T) {
	cases := map[string]string{
		"no comment":          "\tReasonPlanted = \"Planted\"\n",
		"no what to do":       "\t// ReasonPlanted: a planted reason says when, not what to do.\n\tReasonPlanted = \"Planted\"\n",
		"no when":             "\t// ReasonPlanted: What to do: nothing.\n\tReasonPlanted = \"Planted\"\n",
		"an empty what to do": "\t// ReasonPlanted: a planted reason. What to do:\n\tReasonPlanted = \"Planted\"\n",
	}
	for name, decl := range cases {
		t.Run(name, func(t *testing.T) {
			c := plantedAPI(t, "conditions.go", func(s string) string {
				return strings.Replace(s, "\tReasonAsDesired = \"AsDesired\"\n", "\tReasonAsDesired = \"AsDesired\"\n"+decl, 1)
			})
			wantFault(t, c, "reason Planted (ReasonPlanted)")
		})
	}
}

func TestAReasonDefinedTwiceFails(t *testing.T) {
	c := plantedAPI(t, "conditions.go", func(s string) string {
		return s + "\nconst (\n\t// ReasonAgain: planted. What to do: nothing.\n\tReasonAgain = \"AsDesired\"\n)\n"
	})
	wantFault(t, c, "reason AsDesired (ReasonAgain) is also defined")
}

func TestAFieldWithoutACommentFails(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "type GPUSharingPolicySpec struct {\n",
			"type GPUSharingPolicySpec struct {\n\t// +optional\n\tPlanted string `json:\"planted,omitempty\"`\n\n", 1)
	})
	wantFault(t, c, "field GPUSharingPolicySpec.planted has no comment")
}

func TestAFieldNamedByTheCommentBeforeItIsDocumented(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "type GPUSharingPolicySpec struct {\n",
			"type GPUSharingPolicySpec struct {\n\t// first and second are planted together.\n\t// +optional\n\tFirst string `json:\"first,omitempty\"`\n"+
				"\t// +optional\n\tSecond string `json:\"second,omitempty\"`\n\n", 1)
	})
	files, faults, err := generate(c)
	if err != nil || len(faults) != 0 {
		t.Fatalf("generate = %v, %q; want no fault", err, faults)
	}
	if !strings.Contains(string(files["api.md"]), "| `second` | string |  | optional | first and second are planted together. |") {
		t.Error("the second field does not carry the comment that names it")
	}
}

func TestAFieldNeitherOptionalNorRequiredFails(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "type GPUSharingPolicySpec struct {\n",
			"type GPUSharingPolicySpec struct {\n\t// planted is a field without +optional.\n\tPlanted string `json:\"planted,omitempty\"`\n\n", 1)
	})
	wantFault(t, c, "GPUSharingPolicySpec.planted is neither +optional nor +required")
}

func TestAProseLineStartingWithPlusFails(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "\t// priority decides between", "\t// +me or -me, planted prose.\n\t// priority decides between", 1)
	})
	wantFault(t, c, "a comment line that starts with + is a marker to controller-gen")
}

func TestATypeWithoutACommentFails(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "// Drain configures how a GPU is emptied before a disruptive change.\n", "", 1)
	})
	wantFault(t, c, "type Drain has no comment")
}

func TestAStaleReferenceFailsTheCheck(t *testing.T) {
	c := plantedAPI(t, "gpusharingpolicy_types.go", func(s string) string {
		return strings.Replace(s, "// priority decides between policies", "// priority (planted) decides between policies", 1)
	})
	if err := run(c, false); err != nil {
		t.Fatal(err)
	}
	if err := run(c, true); err != nil {
		t.Fatalf("check right after generating: %v", err)
	}
	path := filepath.Join(c.root, c.out, "api.md")
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), "(planted)", "(edited by hand)", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(c, true); err == nil || !strings.Contains(err.Error(), "api.md is not what `make generate` writes") {
		t.Errorf("check of an edited reference = %v, want it stale", err)
	}
}

func TestAShimVariableWithoutARowFails(t *testing.T) {
	dir := t.TempDir()
	c := filepath.Join(dir, "config.c")
	doc := filepath.Join(dir, "shim.md")
	os.WriteFile(c, []byte("x = env_u32(\"GPUSHARE_KNOWN\", 1);\ny = getenv(\"GPUSHARE_PLANTED\");\n"), 0o644)
	os.WriteFile(doc, []byte("| variable | default | meaning |\n| --- | --- | --- |\n| `GPUSHARE_KNOWN` | 1 | known |\n| `GPUSHARE_GONE` | 2 | no longer read |\n"), 0o644)
	faults, err := checkShimEnv(dir, doc)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(faults, "\n")
	if len(faults) != 2 || !strings.Contains(all, "GPUSHARE_GONE has a row but the shim does not read it") ||
		!strings.Contains(all, "the shim reads GPUSHARE_PLANTED, which has no row") {
		t.Errorf("faults = %q, want GPUSHARE_GONE without a read and GPUSHARE_PLANTED without a row", faults)
	}
}

func TestMarkerArgsReadQuotedAndBareValues(t *testing.T) {
	got := markerArgs(`rule="a == 'b, c' && d == \"e\"",message="f, g",priority=1`)
	if got["rule"] != `a == 'b, c' && d == "e"` || got["message"] != "f, g" || got["priority"] != "1" {
		t.Errorf("markerArgs = %q", got)
	}
}

func TestADocNamingAFlagNoBinaryHasFails(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "ref"), 0o755)
	os.MkdirAll(filepath.Join(root, "docs"), 0o755)
	os.WriteFile(filepath.Join(root, "ref", "agent-flags.md"), []byte("| Flag |\n| --- |\n| `--host-root` | string |\n| `--resource-mps` | value |\n"), 0o644)
	os.WriteFile(filepath.Join(root, "docs", "a.md"), []byte("Set `--host-root`, the `--resource-*` names and helm's `--set`.\nThen `--removed-flag=1`.\n"), 0o644)
	faults, err := checkDocFlags(root, "ref", []string{"docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	if len(faults) != 1 || !strings.Contains(faults[0], "docs/a.md:2: --removed-flag is no flag") {
		t.Errorf("faults = %q, want docs/a.md:2 naming --removed-flag", faults)
	}
}
