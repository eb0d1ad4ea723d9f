"""The desired state, without Pulumi: the guard's policies and their CEL, the node labels and device classes, the
node switches and the stack record's claims, each computed from a validated StackConfig. The components wrap these
as resources; `cluster/` (verify, release, leftovers) and the policy pack compare the live cluster with them."""
