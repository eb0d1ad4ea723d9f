// hidden-gpu-test-gfd is a STAND-IN for NVIDIA's GPU Feature Discovery (k8s-device-plugin v0.20.0's
// gpu-feature-discovery, which no registry here serves): the node tier runs it in the image of hidden-gpu's pinned
// GFD DaemonSet. Written here after reading the upstream source (cited as file:line); no upstream code is copied.
//
// What it keeps of NVIDIA's GFD:
//   - its GPUs are the ones its own container was given: NVIDIA's counts what NVML lists (DeviceGetCount and the
//     handles, go-nvlib pkg/nvlib/device/device.go:468-492), which is what the toolkit injected; this one reads the
//     synthetic CDI spec's markers (package marker), the node tier's only stand-in for a GPU.
//   - it writes `key=value` lines, replaced whole (a rename), to GFD_OUTPUT_FILE, default
//     /etc/kubernetes/node-feature-discovery/features.d/gfd (cmd/gpu-feature-discovery/main.go:82-87,
//     internal/lm/output.go:90-113), again every GFD_SLEEP_INTERVAL (default 60s, main.go:76-81).
//   - the labels that count and name GPUs: nvidia.com/gpu.count, .product, .memory, .replicas,
//     .sharing-strategy (internal/lm/resource.go:61-64, 160-177), nvidia.com/gfd.timestamp (timestamp.go:34-36).
//   - GFD_USE_NODE_FEATURE_API other than false is refused: v0.20.0 defaults to NodeFeature objects
//     (main.go:100-105), which this stand-in does not write; the rendered DaemonSet must turn it off.
//
// What it leaves out: CUDA and driver versions, MIG, vGPU, IMEX, machine type, config files.
package main

import (
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"hidden-gpu.test/e2e/node/internal/marker"
)

const (
	product  = "hidden-gpu-test-GPU" // the synthetic GPUs have no model; one name for all, as one model per node
	memoryMB = "81559"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("hidden-gpu-test-gfd (stand-in for NVIDIA's GPU Feature Discovery): ")
	if v := getenv("GFD_USE_NODE_FEATURE_API", "true"); v != "false" {
		log.Fatalf("GFD_USE_NODE_FEATURE_API=%s: this stand-in writes the features file only", v)
	}
	output := getenv("GFD_OUTPUT_FILE", "/etc/kubernetes/node-feature-discovery/features.d/gfd")
	interval, err := time.ParseDuration(getenv("GFD_SLEEP_INTERVAL", "60s"))
	if err != nil {
		log.Fatalf("GFD_SLEEP_INTERVAL: %v", err)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	for {
		gpus := marker.Files()
		if err := write(output, labels(gpus)); err != nil {
			log.Fatalf("writing %s: %v", output, err)
		}
		log.Printf("devices %v: labels written to %s", gpus, output)
		select {
		case <-signals:
			return
		case <-time.After(interval):
		}
	}
}

func labels(gpus []string) []string {
	lines := []string{fmt.Sprintf("nvidia.com/gfd.timestamp=%d", time.Now().Unix())}
	if len(gpus) > 0 {
		lines = append(lines,
			fmt.Sprintf("nvidia.com/gpu.count=%d", len(gpus)),
			"nvidia.com/gpu.product="+product,
			"nvidia.com/gpu.memory="+memoryMB,
			"nvidia.com/gpu.replicas=1",
			"nvidia.com/gpu.sharing-strategy=none",
		)
	}
	return lines
}

// write replaces the file whole: NFD's worker never reads half of it.
func write(path string, lines []string) error {
	temporary, err := os.CreateTemp(filepath.Dir(path), ".gfd-")
	if err != nil {
		return err
	}
	defer os.Remove(temporary.Name())
	if _, err := temporary.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		return err
	}
	if err := temporary.Chmod(0o644); err != nil {
		return err
	}
	if err := temporary.Close(); err != nil {
		return err
	}
	return os.Rename(temporary.Name(), path)
}

func getenv(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok {
		return value
	}
	return fallback
}
