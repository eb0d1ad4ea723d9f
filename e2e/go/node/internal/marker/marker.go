// Package marker names what the node tier's synthetic CDI spec (e2e/node.py) injects into a container for each
// "GPU" it is given: an environment variable and a read-only file. It is the tier's only stand-in for a GPU:
// where NVML would list the GPUs the toolkit put in a container, these programs read the markers.
package marker

import (
	"os"
	"sort"
	"strings"
)

const (
	// Dir holds one file per injected GPU, named by its UUID (the CDI spec's mount of a host file).
	Dir = "/run/hidden-gpu-test/gpus"
	// EnvPrefix starts the variable the CDI spec sets per injected GPU; its value is the UUID.
	EnvPrefix = "HIDDEN_GPU_TEST_GPU_"
	// RequestDir is where the toolkit looks for GPUs requested as volume mounts, and where NVIDIA's plugin
	// mounts /dev/null per allocated GPU (k8s-device-plugin v0.20.0 internal/plugin/server.go:47-48).
	RequestDir = "/var/run/nvidia-container-devices"
)

// Files lists the UUIDs in Dir, sorted; none when Dir is absent.
func Files() []string { return names(Dir) }

// Requested lists the entries of RequestDir, sorted.
func Requested() []string { return names(RequestDir) }

// Envs lists the UUIDs of the marker variables, sorted.
func Envs() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) {
			out = append(out, value)
		}
	}
	sort.Strings(out)
	return out
}

func names(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}
