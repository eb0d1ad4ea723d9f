// The extra minors' type checker (main.go), built by each e2e/go/k8s1xx wrapper through a replace directive, so
// that it links that minor's k8s.io/apiserver. The requirements are the oldest minor's: the wrapper's own versions win.
module hidden-gpu.test/e2e/typecheck

go 1.26.0

require (
	k8s.io/api v0.35.4
	k8s.io/apimachinery v0.35.4
	k8s.io/apiserver v0.35.4
	k8s.io/client-go v0.35.4
)
