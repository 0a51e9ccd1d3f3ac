// Package vksandbox is the module of vk-sandbox, which runs one Skiff
// sandbox host as a virtual-kubelet node beside its sandboxd (pods on it
// become sandboxes) and publishes the host's NodeInventory.
package vksandbox
