package procfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnvValueReadsTheStartEnvironment(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "7"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := "PATH=/bin\x00GPUSHARE_GANG=off\x00GPUSHARE_GANG_X=1\x00EMPTY=\x00"
	if err := os.WriteFile(filepath.Join(dir, "7", "environ"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		ok         bool
	}{{"GPUSHARE_GANG", "off", true}, {"EMPTY", "", true}, {"GPUSHARE", "", false}, {"HOME", "", false}} {
		if v, ok := EnvValue(dir, 7, c.name); v != c.want || ok != c.ok {
			t.Errorf("EnvValue(%s) = %q, %v; want %q, %v", c.name, v, ok, c.want, c.ok)
		}
	}
	if _, ok := EnvValue(dir, 8, "PATH"); ok {
		t.Error("EnvValue found a variable of a process that is gone")
	}
	big := make([]byte, maxEnviron+10)
	copy(big, "GPUSHARE_GANG=off\x00")
	if err := os.WriteFile(filepath.Join(dir, "7", "environ"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := EnvValue(dir, 7, "GPUSHARE_GANG"); ok {
		t.Error("EnvValue read an environment larger than its bound")
	}
}
