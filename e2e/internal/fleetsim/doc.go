// Package fleetsim simulates sandbox hosts for measuring the control plane
// at fleet scale (issue 21): tens to hundreds of hosts of thousands of
// sandboxes each, on one machine, against a real kube-apiserver and etcd
// and the real sandbox-apiserver and sandbox-envd-proxy binaries.
//
// Only sandboxd is simulated. A Host is
//
//   - a Sandboxd: sandboxd's Connect API answered from memory (Info, Watch,
//     Create, Get, List, Kill, SetTimeout; every other call
//     connect.CodeUnimplemented), behind the node token, and its relay's
//     answer to envd's /health for the sandboxes it runs, served over HTTP
//     on a loopback address of its own;
//   - vk-sandbox's inventory path, unchanged: shared/hostinventory's mirror
//     of that sandboxd over a real Connect client and its Watch stream, and
//     shared/publish's InventoryApplier, which server-side-applies the
//     mirror's NodeInventory as the host's own node identity on the real
//     cadence.
//
// So what reaches kube-apiserver and etcd, and what the readers route to,
// is what a fleet of real hosts would send and answer; the sandboxes only
// do not run. A Fleet is N such hosts with sandboxes seeded in the real
// ID format (shared/sandboxid, with each host's tag), and Churn creates
// and kills sandboxes on them at a given rate. Killing a Host (Kill) stops
// its publisher and drops its listener and every connection at once, as a
// kill -9 of sandboxd and vk-sandbox would.
package fleetsim
