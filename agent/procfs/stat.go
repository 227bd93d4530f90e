// Package procfs reads what the agent needs of a process from a proc filesystem (the host's, mounted
// at the agent's --proc-root).
package procfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
)

// ErrBadStat: a stat file without the command name's closing parenthesis.
var ErrBadStat = errors.New("malformed stat line")

// StatFields returns the fields of <root>/<pid>/stat after the command name, state first (then ppid,
// pgrp, session, ...). The command name is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted after its last ')'. A missing process is an error that
// os.IsNotExist recognizes.
func StatFields(root string, pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, ErrBadStat
	}
	f := bytes.Fields(b[i+1:])
	out := make([]string, len(f))
	for k, x := range f {
		out[k] = string(x)
	}
	return out, nil
}
