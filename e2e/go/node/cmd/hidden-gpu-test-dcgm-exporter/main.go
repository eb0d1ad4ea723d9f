// hidden-gpu-test-dcgm-exporter is a STAND-IN for NVIDIA's dcgm-exporter (4.3.1-4.4.0, the version GPU Operator
// d73a0086a6ba pins; no registry here serves it, and DCGM needs a GPU): the node tier runs it in the image of
// hidden-gpu's pinned dcgm-exporter DaemonSet. Written here after reading the upstream source (cited as file:line);
// no upstream code is copied.
//
// What it keeps of NVIDIA's exporter:
//   - its GPUs are the ones its own container was given: DCGM embedded in the exporter enumerates through NVML
//     (DCGM v4.3.1 dcgmlib/src/DcgmCacheManager.cpp:1319), which sees what the toolkit injected; this one reads
//     the synthetic CDI spec's markers (package marker), the node tier's only stand-in for a GPU.
//   - it serves /metrics and /health on DCGM_EXPORTER_LISTEN, default :9400 (pkg/cmd/app.go:124-130,
//     internal/pkg/server/server.go:93-94); /health answers 200 "KO" whatever the state (server.go:269-276).
//   - each series is labelled gpu, UUID, pci_bus_id, device, modelName, Hostname (NODE_NAME), and where
//     DCGM_EXPORTER_KUBERNETES=true (app.go:138-144) pod, namespace, container, read per scrape from the kubelet's
//     PodResources List at /var/lib/kubelet/pod-resources/kubelet.sock (app.go:263-268) and matched by UUID
//     (internal/pkg/rendermetrics/render_metrics.go:47, internal/pkg/collector/gpu_collector.go:286-291).
//   - a failed PodResources read is logged and the series go out without pod labels.
//
// What it leaves out: every field but two gauges (DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_FB_USED, fixed values),
// collectors files, profiling, MIG, remote host engines.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"hidden-gpu.test/e2e/node/internal/marker"
)

const (
	socket   = "/var/lib/kubelet/pod-resources/kubelet.sock"
	resource = "nvidia.com/gpu"
	model    = "hidden-gpu-test-GPU"
)

type owner struct{ pod, namespace, container string }

func main() {
	log.SetFlags(0)
	log.SetPrefix("hidden-gpu-test-dcgm-exporter (stand-in for NVIDIA's dcgm-exporter): ")
	listen := getenv("DCGM_EXPORTER_LISTEN", ":9400")
	log.Printf("devices %v, listening on %s", marker.Files(), listen)
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("KO")) })
	http.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(metrics())) })
	log.Fatal(http.ListenAndServe(listen, nil))
}

func metrics() string {
	owners := map[string]owner{}
	if getenv("DCGM_EXPORTER_KUBERNETES", "false") == "true" {
		var err error
		if owners, err = podOwners(); err != nil {
			log.Printf("PodResources List: %v; series without pod labels", err)
		}
	}
	var out strings.Builder
	for _, field := range []struct{ name, help string }{
		{"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."},
		{"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."},
	} {
		fmt.Fprintf(&out, "# HELP %s %s\n# TYPE %s gauge\n", field.name, field.help, field.name)
		for i, uuid := range marker.Files() {
			labels := fmt.Sprintf(`gpu="%d",UUID="%s",pci_bus_id="",device="nvidia%d",modelName="%s",Hostname="%s"`,
				i, uuid, i, model, os.Getenv("NODE_NAME"))
			if o, ok := owners[uuid]; ok {
				labels += fmt.Sprintf(`,container="%s",namespace="%s",pod="%s"`, o.container, o.namespace, o.pod)
			}
			fmt.Fprintf(&out, "%s{%s} %d\n", field.name, labels, 40+i)
		}
	}
	return out.String()
}

// podOwners maps each allocated nvidia.com/gpu device ID (a UUID) to the container it was allocated to.
func podOwners() (map[string]owner, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	listed, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	owners := map[string]owner{}
	for _, pod := range listed.GetPodResources() {
		for _, container := range pod.GetContainers() {
			for _, devices := range container.GetDevices() {
				if devices.GetResourceName() != resource {
					continue
				}
				for _, id := range devices.GetDeviceIds() {
					owners[id] = owner{pod.GetName(), pod.GetNamespace(), container.GetName()}
				}
			}
		}
	}
	return owners, nil
}

func getenv(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok {
		return value
	}
	return fallback
}
