// Command pause is the sandbox ("pause") container of the real-node e2e: it holds a pod's namespaces,
// reaps the zombies of processes that share its PID namespace, and exits on SIGINT or SIGTERM, as the
// upstream pause does. The upstream image cannot be pulled here, so make images builds this one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
