// Command hidden-gpu-host is etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kubelet in one
// binary, chosen by the name it is run as (argv[0], like the old hyperkube) or by its first argument: the GPU
// host run (lab/gpu_node_run.py) carries it xz-packed, since five separate binaries do not fit the device
// machine's 64 MiB carry beside the rest of the node. Each branch is that program's own main, verbatim
// (k8s.io/kubernetes v1.36.3 cmd/*/*.go; go.etcd.io/etcd/server/v3 v3.6.8 main.go).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // kube-apiserver and kube-controller-manager import it (CronJob time zones)

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

const programs = "etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubelet"

func main() {
	name := filepath.Base(os.Args[0])
	if name == "hidden-gpu-host" && len(os.Args) > 1 {
		// hidden-gpu-host <program> args...: run it as if called by that name.
		name, os.Args = os.Args[1], os.Args[1:]
	}
	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	default:
		fmt.Fprintf(os.Stderr, "hidden-gpu-host: run as (or with the first argument) one of %s\n", programs)
		os.Exit(2)
	}
}
