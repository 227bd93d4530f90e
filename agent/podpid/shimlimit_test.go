package podpid

import (
	"os"
	"path/filepath"
	"testing"
)

func TestShimLimitReadsTheLimitTheProcessStartedWith(t *testing.T) {
	root := t.TempDir()
	write := func(pid, env string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "PATH=/bin\x00GPUSHARE_GPU_UUID=GPU-a\x00GPUSHARE_MEMORY_LIMIT_BYTES=1024\x00")
	write("11", "GPUSHARE_GPU_UUID=GPU-a,GPU-b\x00GPUSHARE_MEMORY_LIMIT_BYTES=GPU-a=512,GPU-b=2048\x00")
	write("12", "GPUSHARE_GPU_UUID=GPU-a\x00")
	for _, c := range []struct {
		pid  int32
		gpu  string
		want uint64
		ok   bool
	}{
		{10, "GPU-a", 1024, true}, {10, "GPU-b", 0, false}, {11, "GPU-b", 2048, true}, {11, "GPU-a", 512, true},
		{11, "GPU-c", 0, false}, {12, "GPU-a", 0, false}, {13, "GPU-a", 0, false},
	} {
		if got, ok := ShimLimit(root, c.pid, c.gpu); got != c.want || ok != c.ok {
			t.Errorf("ShimLimit(%d, %s) = %d, %v; want %d, %v", c.pid, c.gpu, got, ok, c.want, c.ok)
		}
	}
}
