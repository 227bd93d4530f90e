package procfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestStatFieldsCountsAfterTheCommandsLastParenthesis(t *testing.T) {
	root := t.TempDir()
	write := func(pid, line string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("42", "42 (py (rank) 0) Z 1 40 41 0\n")
	write("43", "43 no parenthesis\n")
	if f, err := StatFields(root, 42); err != nil || !slices.Equal(f, []string{"Z", "1", "40", "41", "0"}) {
		t.Errorf("StatFields = %q, %v", f, err)
	}
	if _, err := StatFields(root, 43); !errors.Is(err, ErrBadStat) {
		t.Errorf("a stat line without ')': %v, want ErrBadStat", err)
	}
	if _, err := StatFields(root, 44); !os.IsNotExist(err) {
		t.Errorf("a missing process: %v, want not-exist", err)
	}
}
