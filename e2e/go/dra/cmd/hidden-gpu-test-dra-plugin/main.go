// hidden-gpu-test-dra-plugin stands in for the kubelet plugin of NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu),
// which no registry here serves, on the node tier (tests/node/test_dra_claim.py). It is the smallest thing that
// gives a real kubelet a DRA driver, through k8s.io/dynamic-resource-allocation/kubeletplugin, the helper NVIDIA's
// driver is built on:
//   - it registers with the kubelet through the plugin registration directory (<kubelet root>/plugins_registry)
//     and serves the DRA node service from its own data directory;
//   - it publishes one ResourceSlice for the node, pool = the node's name, every GPU it is given named
//     `gpu-<minor>` with the attributes `type` = "gpu" and `uuid` (NVIDIA's driver publishes every GPU NVML sees,
//     with no per-UUID filter: cmd/gpu-kubelet-plugin/nvlib.go of k8s-dra-driver-gpu v0.4.0); the minor number
//     is the GPU's place in --gpus;
//   - it prepares a claim by answering, for each of its devices the claim was allocated, the CDI device
//     `nvidia.com/gpu=<uuid>` of the node's CDI spec, which the kubelet hands the container runtime. NVIDIA's driver
//     writes a spec per claim instead; what matters here, which GPU reaches the container, is the same.
//
// What it does not copy: MIG, sharing, health, opaque configuration.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
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

func main() {
	var kubeconfig, node, driverName, gpus, registrar, data string
	flag.StringVar(&kubeconfig, "kubeconfig", "", "the driver's identity")
	flag.StringVar(&node, "node", "", "the node this plugin runs on")
	flag.StringVar(&driverName, "driver", "gpu.nvidia.com", "the DRA driver name")
	flag.StringVar(&gpus, "gpus", "", "the node's GPU UUIDs, comma-separated, in minor-number order")
	flag.StringVar(&registrar, "registrar-dir", "", "the kubelet's plugin registration directory")
	flag.StringVar(&data, "plugin-dir", "", "this plugin's data directory (its DRA socket)")
	flag.Parse()
	if kubeconfig == "" || node == "" || gpus == "" || registrar == "" || data == "" {
		log.Fatal("--kubeconfig, --node, --gpus, --registrar-dir and --plugin-dir are required")
	}
	if err := run(kubeconfig, node, driverName, strings.Split(gpus, ","), registrar, data); err != nil {
		log.Fatal(err)
	}
}

func run(kubeconfig, node, driverName string, gpus []string, registrar, data string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	d := &driver{name: driverName, uuids: map[string]string{}}
	devices := make([]resourceapi.Device, 0, len(gpus))
	for minor, uuid := range gpus {
		name := fmt.Sprintf("gpu-%d", minor)
		d.uuids[name] = uuid
		devices = append(devices, resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": {StringValue: ptr.To("gpu")},
				"uuid": {StringValue: ptr.To(uuid)},
			},
		})
	}
	if err := os.MkdirAll(data, 0o750); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(node),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.RegistrarDirectoryPath(registrar),
		kubeletplugin.PluginDataDirectoryPath(data),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	pools := map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devices}}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: pools}); err != nil {
		return fmt.Errorf("publish the ResourceSlice: %w", err)
	}
	log.Printf("serving %s on %s: %d devices published", driverName, node, len(devices))
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
