#ifndef SKIFF_INIT_H
#define SKIFF_INIT_H

#include <stddef.h>

/* SKIFF_INIT_PLAN_ATTR carries the plan of an init done in C (skiff_init.c). */
#define SKIFF_INIT_PLAN_ATTR 27300

/* SKIFF_ROOTFS_TREE_ATTR carries the path of the root that stage 1 clones
 * (open_tree) before it joins a base mount namespace. */
#define SKIFF_ROOTFS_TREE_ATTR 27301

/* skiff_init does the container's standard init from the plan and execs its
 * process; it never returns. rootfs_tree, when not -1, is a detached copy
 * of the root, attached at the plan's root path first. (Skiff) */
void skiff_init(char *plan, size_t len, int rootfs_tree) __attribute__((noreturn));

#endif
