// Command hidden-gpu-typecheck runs one Kubernetes minor's own ValidatingAdmissionPolicy type checker (the one its
// controller manager's validatingadmissionpolicy-status controller runs to fill status.typeChecking) over every
// policy an API server of that minor holds, with the schemas that server serves, and prints each policy's
// expressionWarnings as JSON: {"<policy>": [{"fieldRef": ..., "warning": ...}]}.
//
// Each k8s1xx wrapper module builds it against its own k8s.io/apiserver (a replace directive points here), so the
// checker, its CEL environment and the schemas are that minor's: the extra minors' tiers run no controller manager.
// The controller manager also resolves built-in types from its compiled definitions; the server serves the same ones.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: hidden-gpu-typecheck KUBECONFIG")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "hidden-gpu-typecheck:", err)
		os.Exit(1)
	}
}

func run(kubeconfig string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	// As the controller manager builds them: discovery for the schemas, a deferred discovery mapper for the kinds.
	checker := &validating.TypeChecker{
		SchemaResolver: &resolver.ClientDiscoveryResolver{Discovery: client.Discovery()},
		RestMapper:     restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery())),
	}
	policies, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(
		context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	warnings := map[string][]admissionv1.ExpressionWarning{}
	for i := range policies.Items {
		warnings[policies.Items[i].Name] = checker.Check(&policies.Items[i])
	}
	return json.NewEncoder(os.Stdout).Encode(warnings)
}
