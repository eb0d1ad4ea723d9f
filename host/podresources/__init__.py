"""The kubelet's PodResources API (v1): our own .proto with stubs generated from it (make protos)."""
