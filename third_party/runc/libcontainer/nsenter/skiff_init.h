#ifndef SKIFF_INIT_H
#define SKIFF_INIT_H

#include <stddef.h>

/* SKIFF_INIT_PLAN_ATTR carries the plan of an init done in C (skiff_init.c). */
#define SKIFF_INIT_PLAN_ATTR 27300

/* skiff_init does the container's standard init from the plan and execs its
 * process; it never returns. (Skiff) */
void skiff_init(char *plan, size_t len) __attribute__((noreturn));

#endif
