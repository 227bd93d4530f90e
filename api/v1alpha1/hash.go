package v1alpha1

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// SharingHash identifies a desired sharing: the first 16 hex characters of the SHA-256 of its canonical
// JSON. The agent writes it into status.gpus[].applied.specHash once that sharing is in force, and the
// controller compares it with the hash of spec to tell that the agent has caught up.
//
// The hash must survive upgrades: an agent and a controller of a later version, reading an object whose
// sharing gained a defaulted field, must compute the hash an earlier version wrote, or every GPU of the
// fleet reads as not applied (and is re-applied) after the upgrade. So the canonical form is versioned:
//
//   - Version 1 (this one, no prefix so that hashes written before it stay valid) is encoding/json's
//     output for the fields in sharingHashV1Fields, bit for bit: fields in declaration order, omitempty
//     honoured, quantities and durations in their canonical strings.
//   - Every field added later is left out of the canonical form while it holds its zero value or the
//     default registered for it in sharingHashLaterDefaults, which is where the API server's defaulting
//     puts it on objects written before the field existed. TestSharingHashCoversEveryField fails until a
//     new field is registered there.
//   - A change that cannot follow these rules must bump the version and prefix the hashed bytes with
//     "v<N>:", and the controller must accept the previous version's hash during the upgrade.
func SharingHash(s Sharing) string {
	h, err := sharingHash(s, sharingHashLaterDefaults)
	if err != nil {
		// Sharing holds only strings, numbers, quantities and durations, which always marshal.
		panic("v1alpha1: marshalling Sharing: " + err.Error())
	}
	return h
}

// sharingHash hashes any version of the Sharing type with the given later-field defaults; the tests
// hash a future Sharing through it.
func sharingHash(s any, laterDefaults map[string]string) (string, error) {
	b, err := canonicalJSON(reflect.ValueOf(s), "", laterDefaults)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16], nil
}

// sharingHashV1Fields are the JSON paths of Sharing when the hash's version 1 was fixed. They are hashed
// as encoding/json writes them, defaults included, so the hashes agents already wrote stay valid.
var sharingHashV1Fields = map[string]bool{
	"strategy":                       true,
	"mps":                            true,
	"mps.replicas":                   true,
	"mps.activeThreadPercentage":     true,
	"mps.pinnedMemoryLimit":          true,
	"timeSlicing":                    true,
	"timeSlicing.replicas":           true,
	"timeSlicing.interval":           true,
	"mig":                            true,
	"mig.instances":                  true,
	"mig.instances.profile":          true,
	"mig.instances.count":            true,
	"oversubscription":               true,
	"oversubscription.timeQuantum":   true,
	"oversubscription.antiThrashing": true,
	"oversubscription.memoryBudget":  true,
}

// sharingHashLaterDefaults maps the JSON path of each field added to Sharing after version 1 to its
// default as JSON (the +kubebuilder:default marker's value), or to "" when it has none. Such a field
// is hashed only when it differs from both its zero value and its default.
var sharingHashLaterDefaults = map[string]string{
	"sizing":            "",
	"sizing.mode":       `"Fixed"`,
	"sizing.memoryStep": "",
	"sizing.minMemory":  "",
	// Omitted means Report: both hash alike.
	"sizing.onExceed":                   `"Report"`,
	"qos":                               "",
	"qos.productionPriority":            "",
	"qos.opportunisticQueue":            "",
	"qos.opportunisticQueueTime":        "",
	"qos.settleFloor":                   "",
	"qos.opportunisticThreadPercentage": "",
	"mig.dynamic":                       "",
	// Omitted means Report: both hash alike.
	"unmanagedProcesses":   `"Report"`,
	"mig.dynamic.profiles": "",
}

// canonicalJSON writes v as encoding/json would, except that fields outside sharingHashV1Fields are
// omitted while zero or equal to their entry in laterDefaults.
func canonicalJSON(v reflect.Value, path string, laterDefaults map[string]string) ([]byte, error) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return []byte("null"), nil
		}
		if _, ok := v.Interface().(json.Marshaler); ok {
			return json.Marshal(v.Interface())
		}
		v = v.Elem()
	}
	if v.CanAddr() {
		if _, ok := v.Addr().Interface().(json.Marshaler); ok {
			return json.Marshal(v.Addr().Interface())
		}
	}
	if _, ok := v.Interface().(json.Marshaler); ok {
		return json.Marshal(v.Interface())
	}
	switch v.Kind() {
	case reflect.Struct:
		return canonicalStruct(v, path, laterDefaults)
	case reflect.Slice:
		if v.IsNil() {
			return []byte("null"), nil
		}
		var buf bytes.Buffer
		buf.WriteByte('[')
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				buf.WriteByte(',')
			}
			b, err := canonicalJSON(v.Index(i), path, laterDefaults)
			if err != nil {
				return nil, err
			}
			buf.Write(b)
		}
		buf.WriteByte(']')
		return buf.Bytes(), nil
	default:
		return json.Marshal(v.Interface())
	}
}

func canonicalStruct(v reflect.Value, path string, laterDefaults map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, omitEmpty, ok := jsonName(f)
		if !ok {
			continue
		}
		fv := v.Field(i)
		p := joinPath(path, name)
		if omitEmpty && isEmptyJSON(fv) {
			continue
		}
		if !sharingHashV1Fields[p] {
			if fv.IsZero() {
				continue
			}
			// A later field equal to its default is what an object written before it reads as.
			if def, registered := laterDefaults[p]; registered && def != "" {
				b, err := json.Marshal(fv.Interface())
				if err != nil {
					return nil, err
				}
				if jsonEqual(b, []byte(def)) {
					continue
				}
			}
		}
		b, err := canonicalJSON(fv, p, laterDefaults)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		key, _ := json.Marshal(name)
		buf.Write(key)
		buf.WriteByte(':')
		buf.Write(b)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// jsonName returns a struct field's JSON name and whether it is omitempty; ok is false for fields
// encoding/json skips.
func jsonName(f reflect.StructField) (name string, omitEmpty, ok bool) {
	if !f.IsExported() {
		return "", false, false
	}
	tag := f.Tag.Get("json")
	if tag == "-" {
		return "", false, false
	}
	parts := strings.Split(tag, ",")
	name = parts[0]
	if name == "" {
		name = f.Name
	}
	for _, o := range parts[1:] {
		if o == "omitempty" {
			omitEmpty = true
		}
	}
	return name, omitEmpty, true
}

// isEmptyJSON is encoding/json's omitempty rule.
func isEmptyJSON(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

func joinPath(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
