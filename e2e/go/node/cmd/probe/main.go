// probe prints, one fact a line, what a container was given that decides its GPUs, then sleeps until
// SIGTERM (`probe sleep`, the default) or exits 0 (`probe exit`):
//
//	env NVIDIA_VISIBLE_DEVICES=<value>   (or `env NVIDIA_VISIBLE_DEVICES unset`)
//	cdi-env <uuid>                        one per marker variable the synthetic CDI spec set
//	cdi-file <uuid>                       one per marker file the synthetic CDI spec mounted
//	request <name>                        one per entry of /var/run/nvidia-container-devices
//	done
//
// The tests read the lines from the pod's log; `cdi-*` lines are the GPUs the container sees.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"hidden-gpu.test/e2e/node/internal/marker"
)

func main() {
	if value, ok := os.LookupEnv("NVIDIA_VISIBLE_DEVICES"); ok {
		fmt.Printf("env NVIDIA_VISIBLE_DEVICES=%s\n", value)
	} else {
		fmt.Println("env NVIDIA_VISIBLE_DEVICES unset")
	}
	for _, uuid := range marker.Envs() {
		fmt.Printf("cdi-env %s\n", uuid)
	}
	for _, uuid := range marker.Files() {
		fmt.Printf("cdi-file %s\n", uuid)
	}
	for _, name := range marker.Requested() {
		fmt.Printf("request %s\n", name)
	}
	fmt.Println("done")
	if len(os.Args) > 1 && os.Args[1] == "exit" {
		return
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
