/*
 * How the test clients reach the driver: each entry point through cuGetProcAddress_v2, as CUDA 12+
 * applications do, so the shim's answer to that call is what they run. A client sets gpa from the
 * library it opened; a name that does not resolve ends the client with status 2.
 */
#ifndef GS_TESTS_RESOLVE_H
#define GS_TESTS_RESOLVE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_abi.h"

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static gpa2_fn gpa;

static void *sym(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || p == NULL) {
        fprintf(stderr, "%s: cannot resolve %s\n", program_invocation_short_name, name);
        exit(2);
    }
    return p;
}

#endif
