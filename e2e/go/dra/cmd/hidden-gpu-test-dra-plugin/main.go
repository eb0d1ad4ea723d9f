// hidden-gpu-test-dra-plugin stands in for the kubelet plugin of NVIDIA's DRA driver for GPUs
// (dra-driver-nvidia-gpu `gpu-kubelet-plugin`), which no registry here serves, on the node tier
// (tests/node/test_dra_claim.py). It is the smallest thing that gives a real kubelet a DRA driver, through
// k8s.io/dynamic-resource-allocation/kubeletplugin, the helper NVIDIA's driver is built on. Two ways to run:
//   - as NVIDIA's runs in hidden-gpu's rendered DaemonSet (no --gpus): its GPUs are those its own container was
//     given, read from the markers the node tier's synthetic CDI spec injects (HIDDEN_GPU_TEST_GPU_<minor>=<uuid>),
//     where NVIDIA's enumerates NVML, which in an unprivileged container sees only the GPUs the toolkit injected
//     (../shared/bin/README.md); configured by NVIDIA's environment variables NODE_NAME,
//     KUBELET_REGISTRAR_DIRECTORY_PATH, KUBELET_PLUGINS_DIRECTORY_PATH and HEALTHCHECK_PORT (its gRPC health
//     service `liveness`), with the pod's ServiceAccount (v0.4.1 cmd/gpu-kubelet-plugin/main.go:88-163);
//   - as a host process given --gpus, every GPU of the node: NVIDIA's as its chart runs it, privileged.
//
// Either way:
//   - it registers with the kubelet through the plugin registration directory and serves the DRA node service
//     from its data directory (<plugins>/gpu.nvidia.com);
//   - it publishes one ResourceSlice for the node, pool = the node's name, each GPU named `gpu-<minor>` with the
//     attributes `type` = "gpu" and `uuid` (v0.4.1 cmd/gpu-kubelet-plugin/deviceinfo.go:106-108, 152-197);
//   - it prepares a claim by answering, for each of its devices the claim was allocated, the CDI device
//     `nvidia.com/gpu=<uuid>` of the node's CDI spec, which the kubelet hands the container runtime. NVIDIA's driver
//     writes a spec per claim instead; what matters here, which GPU reaches the container, is the same.
//
// What it does not copy: MIG, sharing, health of the GPUs, opaque configuration, checkpoints.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// cdiKind is the kind of the node's CDI spec: e2e/node.py's synthetic one, one device per UUID.
const cdiKind = "nvidia.com/gpu"

type driver struct {
	name  string
	uuids map[string]string // device name -> UUID
}

// The variables the node tier's CDI spec sets per injected GPU (e2e/node.py cdi_spec): <marker><id>=<uuid> and
// <minor><id>=<its minor number>, where NVML would tell the minor number of a GPU it sees.
const (
	markerPrefix = "HIDDEN_GPU_TEST_GPU_"
	minorPrefix  = "HIDDEN_GPU_TEST_MINOR_"
)

type settings struct {
	kubeconfig, node, driver, registrar, data string
	gpus                                      map[int]string // minor -> UUID
	health                                    int            // the gRPC health port; none where < 0
}

func main() {
	s := settings{health: -1}
	var gpus string
	flag.StringVar(&s.kubeconfig, "kubeconfig", "", "the driver's identity (default: the pod's ServiceAccount)")
	flag.StringVar(&s.node, "node", os.Getenv("NODE_NAME"), "the node this plugin runs on")
	flag.StringVar(&s.driver, "driver", "gpu.nvidia.com", "the DRA driver name")
	flag.StringVar(&gpus, "gpus", "", "every GPU of the node, comma-separated, in minor-number order (default: the container's)")
	flag.StringVar(&s.registrar, "registrar-dir", os.Getenv("KUBELET_REGISTRAR_DIRECTORY_PATH"), "the kubelet's plugin registration directory")
	flag.StringVar(&s.data, "plugin-dir", "", "this plugin's data directory (default: <KUBELET_PLUGINS_DIRECTORY_PATH>/<driver>)")
	flag.Parse()
	if s.data == "" && os.Getenv("KUBELET_PLUGINS_DIRECTORY_PATH") != "" {
		s.data = filepath.Join(os.Getenv("KUBELET_PLUGINS_DIRECTORY_PATH"), s.driver)
	}
	if port, err := strconv.Atoi(os.Getenv("HEALTHCHECK_PORT")); err == nil {
		s.health = port
	}
	s.gpus = map[int]string{}
	if gpus != "" {
		for minor, uuid := range strings.Split(gpus, ",") {
			s.gpus[minor] = uuid
		}
	} else {
		s.gpus = given()
	}
	if s.node == "" || s.registrar == "" || s.data == "" {
		log.Fatal("the node (--node, NODE_NAME), --registrar-dir (KUBELET_REGISTRAR_DIRECTORY_PATH) and --plugin-dir " +
			"(KUBELET_PLUGINS_DIRECTORY_PATH) are required")
	}
	if err := run(s); err != nil {
		log.Fatal(err)
	}
}

// given lists the GPUs this container was given, by the markers the node's CDI spec injected.
func given() map[int]string {
	out := map[int]string{}
	for _, kv := range os.Environ() {
		name, uuid, _ := strings.Cut(kv, "=")
		if id, ok := strings.CutPrefix(name, markerPrefix); ok {
			minor, err := strconv.Atoi(os.Getenv(minorPrefix + id))
			if err != nil {
				log.Fatalf("GPU %s: no minor number (%s%s)", uuid, minorPrefix, id)
			}
			out[minor] = uuid
		}
	}
	return out
}

// serveHealth answers the kubelet's gRPC probes (the rendered DaemonSet's, service "liveness") as NVIDIA's does.
func serveHealth(port int) error {
	listener, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	status := health.NewServer()
	status.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(server, status)
	go func() { _ = server.Serve(listener) }()
	return nil
}

func run(s settings) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	config, err := rest.InClusterConfig()
	if s.kubeconfig != "" {
		config, err = clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	}
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	d := &driver{name: s.driver, uuids: map[string]string{}}
	minors := make([]int, 0, len(s.gpus))
	for minor := range s.gpus {
		minors = append(minors, minor)
	}
	sort.Ints(minors)
	devices := make([]resourceapi.Device, 0, len(minors))
	for _, minor := range minors {
		name, uuid := fmt.Sprintf("gpu-%d", minor), s.gpus[minor]
		d.uuids[name] = uuid
		log.Printf("Adding device %s (%s)", name, uuid)
		devices = append(devices, resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": {StringValue: ptr.To("gpu")},
				"uuid": {StringValue: ptr.To(uuid)},
			},
		})
	}
	if s.health >= 0 {
		if err := serveHealth(s.health); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(s.data, 0o750); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(s.node),
		kubeletplugin.DriverName(s.driver),
		kubeletplugin.RegistrarDirectoryPath(s.registrar),
		kubeletplugin.PluginDataDirectoryPath(s.data),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	pools := map[string]resourceslice.Pool{s.node: {Slices: []resourceslice.Slice{{Devices: devices}}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	log.Printf("serving %s on %s: %d devices published", s.driver, s.node, len(devices))
	<-ctx.Done()
	return nil
}

// PrepareResourceClaims answers each claim's devices of this driver as CDI device IDs; a device it did not
// publish fails that claim (the kubelet retries, the pod does not start).
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var result kubeletplugin.PrepareResult
		for _, allocated := range claim.Status.Allocation.Devices.Results {
			if allocated.Driver != d.name {
				continue
			}
			uuid, ok := d.uuids[allocated.Device]
			if !ok {
				result.Err = fmt.Errorf("claim %s/%s: device %q is not one this plugin published", claim.Namespace, claim.Name, allocated.Device)
				break
			}
			result.Devices = append(result.Devices, kubeletplugin.Device{
				Requests:     []string{allocated.Request},
				PoolName:     allocated.Pool,
				DeviceName:   allocated.Device,
				CDIDeviceIDs: []string{cdiKind + "=" + uuid},
			})
			log.Printf("prepared claim %s/%s: %s (%s)", claim.Namespace, claim.Name, allocated.Device, uuid)
		}
		out[claim.UID] = result
	}
	return out, nil
}

// UnprepareResourceClaims has nothing to undo: the CDI spec is the node's, not the claim's.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, claim := range claims {
		out[claim.UID] = nil
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
}
