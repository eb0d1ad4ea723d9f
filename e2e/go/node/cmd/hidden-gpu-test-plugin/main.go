// hidden-gpu-test-plugin is a STAND-IN for NVIDIA's k8s-device-plugin v0.20.0, which no registry here serves:
// the node tier (tests/node) runs it in the image of the rendered device-plugin DaemonSet, the one image
// substitution there. It is written here, as small as the tests need, after reading the upstream source
// (github.com/NVIDIA/k8s-device-plugin at v0.20.0, cited as file:line); no upstream code is copied.
//
// What it keeps of NVIDIA's plugin:
//   - its devices are the GPUs its own container was given: NVIDIA's lists them through NVML, which sees only
//     what the toolkit injected into its container; this one reads the synthetic CDI spec's markers (package
//     marker), the node tier's only stand-in for a GPU. No device: it registers nothing and waits
//     (cmd/nvidia-device-plugin/main.go:402-417).
//   - it serves nvidia-gpu.sock in /var/lib/kubelet/device-plugins (internal/plugin/server.go:103-107) and
//     registers resource nvidia.com/gpu with the kubelet at kubelet.sock (server.go:229-256), again when the
//     kubelet's socket is created anew (main.go:314-320; inotify here, fsnotify there).
//   - DEVICE_ID_STRATEGY uuid only (the devices' IDs are their UUIDs); other values are refused.
//   - Allocate answers as getAllocateResponse (server.go:322-364) does for DEVICE_LIST_STRATEGY, a comma
//     list of: cdi-cri, one CDI device nvidia.com/gpu=<id> per ID (updateResponseForCDI, server.go:377-408);
//     then, unless every strategy is CDI (server.go:350-353), envvar: NVIDIA_VISIBLE_DEVICES=<ids, comma
//     joined> (updateResponseForDeviceListEnvVar, server.go:481-483); volume-mounts:
//     NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and one mount /dev/null ->
//     /var/run/nvidia-container-devices/<id> per ID (updateResponseForDeviceMounts, server.go:496-514).
//     An ID it does not advertise is refused, as ValidateRequest (internal/rm/rm.go:83) refuses unknown IDs.
//
// What it leaves out: health checks, MIG, MPS, IMEX, GetPreferredAllocation, cdi-annotations, device specs,
// config files.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"hidden-gpu.test/e2e/node/internal/marker"
)

const (
	resource      = "nvidia.com/gpu"
	endpoint      = "nvidia-gpu.sock"
	visibleEnv    = "NVIDIA_VISIBLE_DEVICES"
	devNull       = "/dev/null"
	strategyEnv   = "envvar"
	strategyMount = "volume-mounts"
	strategyCDI   = "cdi-cri"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices    []string
	strategies []string
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("hidden-gpu-test-plugin (stand-in for NVIDIA's device plugin): ")
	if id := getenv("DEVICE_ID_STRATEGY", "uuid"); id != "uuid" {
		log.Fatalf("DEVICE_ID_STRATEGY %q: this stand-in answers with UUIDs only", id)
	}
	p := &plugin{devices: marker.Files()}
	for _, s := range strings.Split(getenv("DEVICE_LIST_STRATEGY", strategyEnv), ",") {
		if s = strings.TrimSpace(s); s != strategyEnv && s != strategyMount && s != strategyCDI {
			log.Fatalf("DEVICE_LIST_STRATEGY %q: this stand-in knows envvar, volume-mounts, cdi-cri", s)
		}
		p.strategies = append(p.strategies, strings.TrimSpace(s))
	}
	log.Printf("devices %v, strategies %v", p.devices, p.strategies)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if len(p.devices) == 0 {
		log.Print("no devices found; waiting indefinitely")
		<-ctx.Done()
		return
	}
	for ctx.Err() == nil {
		if err := p.serve(ctx); err != nil {
			log.Printf("%v; again in 1 s", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// serve runs the gRPC server and registers it, until ctx ends or the kubelet's socket is created anew.
func (p *plugin) serve(ctx context.Context) error {
	// Watched before registering, so a kubelet restarting meanwhile is seen. By inotify, as NVIDIA's plugin does
	// (fsnotify): a poll comparing the socket's inode missed a restart when the new socket got the old inode.
	created, err := watchCreate(pluginapi.DevicePluginPath)
	if err != nil {
		return err
	}
	defer unix.Close(created)
	socket := filepath.Join(pluginapi.DevicePluginPath, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	defer func() {
		server.Stop()
		_ = os.Remove(socket)
	}()
	if err := register(ctx); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	log.Printf("registered %s with the kubelet, serving %s", resource, socket)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
		names, err := createdNames(created)
		if err != nil {
			return err
		}
		if slices.Contains(names, filepath.Base(pluginapi.KubeletSocket)) || slices.Contains(names, lostTrack) {
			return fmt.Errorf("kubelet socket %s created anew (or the watch lost track): the kubelet restarted", pluginapi.KubeletSocket)
		}
	}
}

// lostTrack stands for the events an inotify watch could not report (a name no file can have).
const lostTrack = "/"

// watchCreate returns a non-blocking inotify descriptor reporting files created in dir.
func watchCreate(dir string) (int, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("inotify watch %s: %w", dir, err)
	}
	return fd, nil
}

// createdNames drains the descriptor: the names of the files created since the last call.
func createdNames(fd int) ([]string, error) {
	var names []string
	buffer := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buffer)
		if err == unix.EAGAIN {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("inotify read: %w", err)
		}
		for offset := 0; offset+unix.SizeofInotifyEvent <= n; {
			event := (*unix.InotifyEvent)(unsafe.Pointer(&buffer[offset]))
			name := buffer[offset+unix.SizeofInotifyEvent : offset+unix.SizeofInotifyEvent+int(event.Len)]
			if event.Mask&(unix.IN_Q_OVERFLOW|unix.IN_IGNORED) != 0 {
				// Events were dropped, or the directory went: assume the worst, as a restart.
				names = append(names, lostTrack)
			} else {
				names = append(names, strings.TrimRight(string(name), "\x00"))
			}
			offset += unix.SizeofInotifyEvent + int(event.Len)
		}
	}
}

func register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+pluginapi.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{},
	})
	return err
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once, all healthy, and holds the stream open.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	devices := make([]*pluginapi.Device, 0, len(p.devices))
	for _, id := range p.devices {
		devices = append(devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		for _, id := range container.DevicesIds {
			if !slices.Contains(p.devices, id) {
				return nil, fmt.Errorf("invalid allocation request for %q: unknown device %q", resource, id)
			}
		}
		out.ContainerResponses = append(out.ContainerResponses, p.response(container.DevicesIds))
		log.Printf("allocated %v", container.DevicesIds)
	}
	return out, nil
}

func (p *plugin) response(ids []string) *pluginapi.ContainerAllocateResponse {
	response := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	if slices.Contains(p.strategies, strategyCDI) {
		for _, id := range ids {
			response.CdiDevices = append(response.CdiDevices, &pluginapi.CDIDevice{Name: resource + "=" + id})
		}
	}
	if !slices.ContainsFunc(p.strategies, func(s string) bool { return s != strategyCDI }) {
		return response
	}
	if slices.Contains(p.strategies, strategyEnv) {
		response.Envs[visibleEnv] = strings.Join(ids, ",")
	}
	if slices.Contains(p.strategies, strategyMount) {
		response.Envs[visibleEnv] = marker.RequestDir
		for _, id := range ids {
			response.Mounts = append(response.Mounts, &pluginapi.Mount{
				HostPath: devNull, ContainerPath: filepath.Join(marker.RequestDir, id),
			})
		}
	}
	return response
}

func getenv(name, fallback string) string {
	if value, ok := os.LookupEnv(name); ok && value != "" {
		return value
	}
	return fallback
}
