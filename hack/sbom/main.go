// Command sbom writes the SPDX 2.3 JSON software bill of materials of an image make images built: the
// Debian packages its base was unpacked from (-debs, the list hack/debian-rootfs.sh writes beside the
// root file system: name, version, architecture, SHA-256 of the .deb), each file added on top (-file
// /dest=src, with its SHA-256) and, for a Go binary among them, the Go toolchain and every module
// compiled into it (read from the binary's build information, as `go version -m` prints it).
package main

import (
	"bufio"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"time"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// The SPDX 2.3 JSON fields written (https://spdx.github.io/spdx-spec/v2.3/).
type document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      creationInfo   `json:"creationInfo"`
	DocumentDescribes []string       `json:"documentDescribes"`
	Packages          []pkg          `json:"packages"`
	Relationships     []relationship `json:"relationships"`
}

type creationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type pkg struct {
	SPDXID           string        `json:"SPDXID"`
	Name             string        `json:"name"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	LicenseConcluded string        `json:"licenseConcluded"`
	LicenseDeclared  string        `json:"licenseDeclared"`
	CopyrightText    string        `json:"copyrightText"`
	PrimaryPurpose   string        `json:"primaryPackagePurpose,omitempty"`
	Checksums        []checksum    `json:"checksums,omitempty"`
	ExternalRefs     []externalRef `json:"externalRefs,omitempty"`
	Comment          string        `json:"comment,omitempty"`
}

type checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type externalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

func main() {
	var files listFlag
	out := flag.String("o", "", "SPDX JSON file to write")
	ref := flag.String("ref", "", "the image's name, e.g. docker.io/gpusharing/agent:e2e")
	debs := flag.String("debs", "", "the Debian packages of the image's base: lines of name, version, architecture, sha256 (hack/debian-rootfs.sh)")
	at := flag.Int64("created", 0, "creation time in seconds since the epoch (a reproducible build's SOURCE_DATE_EPOCH); 0 is now")
	flag.Var(&files, "file", "/dest=src: a file the image adds (repeatable); Go binaries list their modules")
	flag.Parse()
	if *out == "" || *ref == "" {
		fmt.Fprintln(os.Stderr, "sbom: -o and -ref are required")
		os.Exit(2)
	}
	created := time.Now().UTC()
	if *at != 0 {
		created = time.Unix(*at, 0).UTC()
	}
	doc, err := build(*ref, *debs, files, created)
	if err == nil {
		err = write(*out, doc)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + idUnsafe.ReplaceAllString(name, "-")
}

func build(ref, debList string, files []string, at time.Time) (*document, error) {
	image := pkg{
		SPDXID: spdxID("Image", ref), Name: ref, DownloadLocation: "NOASSERTION", PrimaryPurpose: "CONTAINER",
		LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
	}
	doc := &document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: ref,
		CreationInfo:      creationInfo{Created: at.Format(time.RFC3339), Creators: []string{"Organization: gpusharing", "Tool: gpusharing-hack-sbom"}},
		DocumentDescribes: []string{image.SPDXID},
		Packages:          []pkg{image},
	}
	seen := map[string]bool{image.SPDXID: true}
	add := func(p pkg) {
		if seen[p.SPDXID] {
			return
		}
		seen[p.SPDXID] = true
		if p.DownloadLocation == "" {
			p.DownloadLocation = "NOASSERTION"
		}
		p.LicenseConcluded, p.LicenseDeclared, p.CopyrightText = "NOASSERTION", "NOASSERTION", "NOASSERTION"
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, relationship{Element: image.SPDXID, Type: "CONTAINS", Related: p.SPDXID})
	}
	doc.Relationships = append(doc.Relationships, relationship{Element: doc.SPDXID, Type: "DESCRIBES", Related: image.SPDXID})

	if debList != "" {
		debs, err := readDebs(debList)
		if err != nil {
			return nil, err
		}
		for _, d := range debs {
			add(d)
		}
	}
	for _, f := range files {
		dest, src, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dest, "/") {
			return nil, fmt.Errorf("-file %q: want /dest=src", f)
		}
		sum, err := fileSHA256(src)
		if err != nil {
			return nil, err
		}
		file := pkg{SPDXID: spdxID("File", dest), Name: dest, PrimaryPurpose: "FILE",
			Checksums: []checksum{{Algorithm: "SHA256", Value: sum}}}
		info, err := buildinfo.ReadFile(src)
		if err != nil {
			add(file)
			continue
		}
		file.PrimaryPurpose = "APPLICATION"
		file.VersionInfo = info.Main.Version
		file.Comment = "Go binary of package " + info.Path
		add(file)
		add(pkg{SPDXID: spdxID("Go", "stdlib-"+info.GoVersion), Name: "stdlib", VersionInfo: info.GoVersion,
			ExternalRefs: []externalRef{purl("golang", "stdlib", strings.TrimPrefix(info.GoVersion, "go"))}})
		for _, m := range modules(info) {
			add(pkg{SPDXID: spdxID("Go", m.Path+"-"+m.Version), Name: m.Path, VersionInfo: m.Version,
				ExternalRefs: []externalRef{purl("golang", m.Path, m.Version)}})
		}
	}
	return doc, nil
}

// modules are the modules compiled into a binary: the main module and every dependency, a replaced one
// as its replacement.
func modules(info *buildinfo.BuildInfo) []debug.Module {
	var out []debug.Module
	if info.Main.Path != "" {
		out = append(out, info.Main)
	}
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		out = append(out, *d)
	}
	return out
}

func purl(typ, name, version string) externalRef {
	loc := "pkg:" + typ + "/" + name
	if version != "" {
		loc += "@" + purlEscape(version)
	}
	return externalRef{Category: "PACKAGE-MANAGER", Type: "purl", Locator: loc}
}

// purlEscape percent-encodes a purl version: a Debian epoch's ':' and revision's '+' included.
func purlEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-_~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// readDebs reads hack/debian-rootfs.sh's list: one package a line, "name version arch sha256".
func readDebs(path string) ([]pkg, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []pkg
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 4 || len(fields[3]) != 64 {
			return nil, fmt.Errorf("%s:%d: want name version arch sha256, got %q", path, n, s.Text())
		}
		name, version, arch, sum := fields[0], fields[1], fields[2], fields[3]
		ref := purl("deb", "debian/"+name, version)
		ref.Locator += "?arch=" + arch + "&distro=debian-12"
		out = append(out, pkg{SPDXID: spdxID("Deb", name+"-"+version), Name: name, VersionInfo: version,
			Checksums: []checksum{{Algorithm: "SHA256", Value: sum}}, ExternalRefs: []externalRef{ref}})
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no packages")
	}
	return out, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// write stamps the document's namespace with a hash of its content (unique per distinct SBOM, as SPDX
// asks) and writes it.
func write(path string, doc *document) error {
	doc.DocumentNamespace = ""
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	doc.DocumentNamespace = "https://gpusharing.io/spdx/" + url.PathEscape(idUnsafe.ReplaceAllString(doc.Name, "-")) + "-" + hex.EncodeToString(sum[:8])
	b, err = json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
