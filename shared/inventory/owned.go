package inventory

import (
	"github.com/skiff-dev/skiff/api/v1beta1"
	"github.com/skiff-dev/skiff/shared/sandboxid"
)

// Owned returns the entries of inv that inv's node can own: those whose ID
// is as long as a sandbox ID and ends in the node's tag (sandboxid.NodeTag).
//
// A host writes only its own inventory (api/policies), but what it writes
// there is still its word. A sandbox ID ends in the tag of the node that
// made it, so an entry with another tag is a host listing sandboxes that are
// not its own: to show them in their team's lists, to be claimed in their
// place, or to draw their traffic. Readers drop such entries, with Owned or
// Owns: the apiserver in its lists and claims, the envd proxy in its
// routing index. (Two nodes may share a tag by chance; between those, the
// tag cannot tell, and sandboxd's answer settles it, see sandboxid.)
//
// Owned never writes to inv, which may be an informer cache's own object:
// when every entry is owned, the normal case, it returns inv.Spec.Sandboxes
// itself, without a copy; otherwise a new slice of the owned entries, in
// their order.
func Owned(inv *v1beta1.NodeInventory) []v1beta1.SandboxEntry {
	all := inv.Spec.Sandboxes
	if len(all) == 0 {
		return all
	}
	tag := sandboxid.NodeTag(inv.Name)
	for i := range all {
		if !tagged(all[i].ID, tag) {
			return ownedFrom(all, i, tag)
		}
	}
	return all
}

// ownedFrom copies the owned entries of all, the first of which not owned
// is at first.
func ownedFrom(all []v1beta1.SandboxEntry, first int, tag sandboxid.Tag) []v1beta1.SandboxEntry {
	out := make([]v1beta1.SandboxEntry, first, len(all)-1)
	copy(out, all[:first])
	for i := first + 1; i < len(all); i++ {
		if tagged(all[i].ID, tag) {
			out = append(out, all[i])
		}
	}
	return out
}

// Owns reports whether the node named node can own the sandbox id: whether
// id is as long as a sandbox ID and ends in the node's tag.
func Owns(node, id string) bool {
	return tagged(id, sandboxid.NodeTag(node))
}

// tagged reports whether id has a sandbox ID's length and ends in tag. It
// does not check the other characters: the CRD's schema admits only
// [a-z0-9]{20}, every lookup parses the ID it is given, and a full check
// would cost the apiserver's lists half a millisecond per 8,000 entries.
func tagged(id string, tag sandboxid.Tag) bool {
	return len(id) == sandboxid.Len && sandboxid.Tag(id[sandboxid.Len-sandboxid.TagLen:]) == tag
}
