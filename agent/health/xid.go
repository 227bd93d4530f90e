package health

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// DefaultIgnoredXids are the Xids NVIDIA's device plugin ignores: errors an application causes, after
// which the GPU is still healthy.
var DefaultIgnoredXids = []uint64{
	13,  // Graphics Engine Exception
	31,  // GPU memory page fault
	43,  // GPU stopped processing
	45,  // Preemptive cleanup, due to previous errors
	68,  // Video processor exception
	109, // Context Switch Timeout Error
}

// xidDescriptions are NVIDIA's names of common Xids (docs.nvidia.com/deploy/xid-errors); an Xid not
// listed is reported by number only.
var xidDescriptions = map[uint64]string{
	13:  "Graphics Engine Exception",
	31:  "GPU memory page fault",
	32:  "Invalid or corrupted push buffer stream",
	38:  "Driver firmware error",
	43:  "GPU stopped processing",
	45:  "Preemptive cleanup, due to previous errors",
	48:  "Double Bit ECC Error",
	61:  "Internal micro-controller breakpoint/warning",
	62:  "Internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	68:  "Video processor exception",
	69:  "Graphics Engine class error",
	74:  "NVLink Error",
	79:  "GPU has fallen off the bus",
	92:  "High single-bit ECC error rate",
	94:  "Contained ECC error",
	95:  "Uncontained ECC error",
	109: "Context Switch Timeout Error",
	119: "GSP RPC Timeout",
	120: "GSP Error",
}

// XidDescription is NVIDIA's name of the Xid, or "" when it is not known here.
func XidDescription(xid uint64) string { return xidDescriptions[xid] }

// ParseXids parses a comma-separated list of Xids ("13,31, 43"); the empty string is the empty list.
func ParseXids(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("the Xid %q is not a number", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// FormatXids renders Xids as ParseXids reads them, in increasing order (for a flag's default).
func FormatXids(xids []uint64) string {
	s := append([]uint64(nil), xids...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}
