// The steps of skiff_userns_new (userns_owner.c), for its errors.
enum {
	SKIFF_USERNS_CLONE = 1,
	SKIFF_USERNS_SETGROUPS,
	SKIFF_USERNS_SETGID,
	SKIFF_USERNS_SETUID,
	SKIFF_USERNS_PDEATHSIG,
	SKIFF_USERNS_UNSHARE,
	SKIFF_USERNS_UIDMAP,
	SKIFF_USERNS_GIDMAP,
	SKIFF_USERNS_OPEN,
};

// skiff_userns_new makes a user namespace owned by host uid and gid id,
// mapping its 0..count-1 to id..id+count-1, and returns a file descriptor
// of it, or -errno with *step set to the step that failed.
int skiff_userns_new(unsigned int id, unsigned int count, int *step);
