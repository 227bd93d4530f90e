package flagref

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ref(fs *flag.FlagSet) Reference {
	return Reference{Binary: "demo", Source: "cmd/demo", Intro: "The demo's flags.", Commands: []Command{{Name: "demo", Flags: fs}}}
}

func flags() *flag.FlagSet {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.String("root", "/run/x", "the `directory` under <root>/<uuid>")
	fs.Bool("on", true, "turn it on (a|b)")
	fs.Duration("every", 30*time.Second, "how often")
	fs.Func("size", "how much (default 2Gi)", func(string) error { return nil })
	fs.String("tool", "", "path of the tool (default: found under --root)")
	return fs
}

func TestRenderListsEveryFlagWithTypeDefaultAndUsage(t *testing.T) {
	b, err := Render(ref(flags()))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `--every` | duration | `30s` | how often |",
		"| `--on` | bool | `true` | turn it on (a\\|b) |",
		"| `--root` | directory | `/run/x` | the directory under &lt;root&gt;/&lt;uuid&gt; |",
		"| `--size` | value | `2Gi` | how much |",
		"| `--tool` | string | found under --root | path of the tool |",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("reference lacks %q:\n%s", want, b)
		}
	}
}

func TestAFlagWithoutUsageFails(t *testing.T) {
	fs := flags()
	fs.Int("silent", 0, "")
	if _, err := Render(ref(fs)); err == nil || !strings.Contains(err.Error(), "flag --silent of demo has no usage string") {
		t.Errorf("Render = %v, want the flag without usage named", err)
	}
}

func TestCheckFailsOnAFlagWithoutAnEntryAndPassesOnceWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo-flags.md")
	if err := Check(path, ref(flags()), true); err != nil {
		t.Fatal(err)
	}
	if err := Check(path, ref(flags()), false); err != nil {
		t.Fatalf("check right after writing: %v", err)
	}
	planted := flags()
	planted.String("planted", "", "a flag the reference does not list")
	if err := Check(path, ref(planted), false); err == nil || !strings.Contains(err.Error(), "flag --planted has no entry") {
		t.Errorf("Check = %v, want --planted without an entry", err)
	}
	fewer := flag.NewFlagSet("demo", flag.ContinueOnError)
	fewer.String("root", "/run/x", "the `directory` under <root>/<uuid>")
	fewer.Bool("on", true, "turn it on (a|b)")
	fewer.Func("size", "how much (default 2Gi)", func(string) error { return nil })
	fewer.String("tool", "", "path of the tool (default: found under --root)")
	if err := Check(path, ref(fewer), false); err == nil || !strings.Contains(err.Error(), "the entry of --every names no flag") {
		t.Errorf("Check = %v, want the entry of a removed flag named", err)
	}
	changed := flags()
	changed.Lookup("every").DefValue = "1m0s"
	if err := Check(path, ref(changed), false); err == nil || !strings.Contains(err.Error(), "the entry of --every differs") {
		t.Errorf("Check = %v, want the entry of a changed default named", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := Check(path, ref(flags()), false); err == nil || !strings.Contains(err.Error(), "run make generate") {
		t.Errorf("Check of a missing file = %v", err)
	}
}

func TestSubcommandsGetASectionEachAndTheirFlagsAreKeptApart(t *testing.T) {
	plan := flag.NewFlagSet("plan", flag.ContinueOnError)
	plan.String("root", "", "the plan's root")
	r := ref(flags())
	r.Commands = append(r.Commands, Command{Name: "demo plan", Intro: "Plans.", Flags: plan})
	b, err := Render(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\n## demo plan\n\nPlans.\n\n| Flag |") {
		t.Errorf("no section for the subcommand:\n%s", b)
	}
	path := filepath.Join(t.TempDir(), "demo-flags.md")
	if err := Check(path, r, true); err != nil {
		t.Fatal(err)
	}
	plan.String("planted", "", "planted")
	if err := Check(path, r, false); err == nil || !strings.Contains(err.Error(), "flag demo plan --planted has no entry") {
		t.Errorf("Check = %v, want the subcommand's flag named", err)
	}
}
