package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const libcSum = "1111111111111111111111111111111111111111111111111111111111111111"

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestListsTheBasePackagesTheFilesAndTheGoModules(t *testing.T) {
	debs := writeFile(t, "rootfs.debs", "libc6 2.36-9+deb12u14 amd64 "+libcSum+"\n"+
		"busybox-static 1:1.35.0-4+deb12u1+b1 amd64 2222222222222222222222222222222222222222222222222222222222222222\n")
	goBin, err := os.Executable() // this test binary carries Go build information, as /agent does
	if err != nil {
		t.Fatal(err)
	}
	lib := writeFile(t, "libgpushare.so", "not a Go binary")
	out := filepath.Join(t.TempDir(), "agent.spdx.json")
	doc, err := build("docker.io/gpusharing/agent:e2e", debs, []string{"/agent=" + goBin, "/opt/gpusharing/libgpushare.so=" + lib}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := write(out, doc); err != nil {
		t.Fatal(err)
	}

	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got document
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("the SBOM is not JSON: %v", err)
	}
	if got.SPDXVersion != "SPDX-2.3" || got.DataLicense != "CC0-1.0" || got.SPDXID != "SPDXRef-DOCUMENT" ||
		!strings.HasPrefix(got.DocumentNamespace, "https://") || got.CreationInfo.Created != "1970-01-01T00:00:00Z" {
		t.Errorf("document header %+v is not SPDX 2.3's", got)
	}
	ids := map[string]pkg{}
	for _, p := range got.Packages {
		if _, dup := ids[p.SPDXID]; dup {
			t.Errorf("SPDXID %s twice", p.SPDXID)
		}
		ids[p.SPDXID] = p
	}
	for _, r := range got.Relationships {
		if _, ok := ids[r.Related]; !ok {
			t.Errorf("relationship %+v names no package", r)
		}
	}
	if len(got.DocumentDescribes) != 1 || ids[got.DocumentDescribes[0]].PrimaryPurpose != "CONTAINER" {
		t.Errorf("the document describes %v, want the image", got.DocumentDescribes)
	}

	byName := map[string]pkg{}
	for _, p := range got.Packages {
		byName[p.Name] = p
	}
	libc := byName["libc6"]
	if libc.VersionInfo != "2.36-9+deb12u14" || len(libc.Checksums) != 1 || libc.Checksums[0].Value != libcSum ||
		len(libc.ExternalRefs) != 1 || libc.ExternalRefs[0].Locator != "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64&distro=debian-12" {
		t.Errorf("libc6 %+v", libc)
	}
	if bb := byName["busybox-static"]; len(bb.ExternalRefs) != 1 || !strings.Contains(bb.ExternalRefs[0].Locator, "@1%3A1.35.0-4%2Bdeb12u1%2Bb1?") {
		t.Errorf("busybox-static's purl does not encode the epoch and revision: %+v", bb.ExternalRefs)
	}
	if a := byName["/agent"]; a.PrimaryPurpose != "APPLICATION" || len(a.Checksums) != 1 || len(a.Checksums[0].Value) != 64 {
		t.Errorf("/agent %+v", a)
	}
	if l := byName["/opt/gpusharing/libgpushare.so"]; l.PrimaryPurpose != "FILE" || len(l.Checksums) != 1 {
		t.Errorf("libgpushare.so %+v", l)
	}
	if std := byName["stdlib"]; std.VersionInfo != runtime.Version() {
		t.Errorf("stdlib %+v, want the toolchain %s the binary was built with", std, runtime.Version())
	}
	if m := byName["github.com/gpusharing/gpusharing"]; len(m.ExternalRefs) != 1 || !strings.HasPrefix(m.ExternalRefs[0].Locator, "pkg:golang/github.com/gpusharing/gpusharing") {
		t.Errorf("the main module %+v is not listed with its purl", m)
	}
}

func TestRefusesAMalformedPackageList(t *testing.T) {
	debs := writeFile(t, "rootfs.debs", "libc6 2.36-9+deb12u14 amd64\n")
	if _, err := build("x", debs, nil, time.Unix(0, 0)); err == nil || !strings.Contains(err.Error(), "want name version arch sha256") {
		t.Errorf("err %v, want a refusal of the line", err)
	}
}
