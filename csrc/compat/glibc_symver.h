/* Bind the few glibc symbols whose default version moved to GLIBC_2.34 (when libpthread was
 * merged into libc) back to their original versions, so that a wheel built on a current
 * Debian/Ubuntu runs on any glibc >= 2.17 and auditwheel can tag it manylinux_2_17.
 *
 * Force-included (-include) into every C file of the core when TR_GLIBC_COMPAT is ON (the
 * wheel build: see pyproject.toml). The old versions are the same functions: glibc keeps them
 * as aliases of the new ones (objdump -T libc.so.6 lists both at one address). The sanitizer
 * and test builds leave it off. x86-64 only: other architectures start at GLIBC_2.17 anyway.
 * A new pthread call in csrc/ may need a line here: scripts/test.sh's auditwheel step fails
 * (naming the symbol with `auditwheel show`) when one is missing.
 */
#ifndef TAILRACE_COMPAT_GLIBC_SYMVER_H
#define TAILRACE_COMPAT_GLIBC_SYMVER_H

#include <limits.h> /* defines __GLIBC__ (through features.h) on glibc */

#if defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver pthread_create, pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_join, pthread_join@GLIBC_2.2.5");
__asm__(".symver pthread_detach, pthread_detach@GLIBC_2.2.5");
__asm__(".symver pthread_condattr_setclock, pthread_condattr_setclock@GLIBC_2.3.3");
#endif

#endif
