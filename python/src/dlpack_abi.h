/* SPDX-License-Identifier: MIT */
/*
 * dlpack_abi.h - the DLPack structures kvpool exports (the ABI of
 * https://dmlc.github.io/dlpack/latest/c_api.html, written out here so the
 * extension needs no header beyond Python's): the legacy DLManagedTensor
 * ("dltensor" capsules) and DLPack 1.x's DLManagedTensorVersioned
 * ("dltensor_versioned").
 */
#ifndef KVPOOL_DLPACK_ABI_H
#define KVPOOL_DLPACK_ABI_H

#include <stdint.h>

enum { KVP_DL_CPU = 1, KVP_DL_CUDA = 2 };          /* DLDeviceType */
enum { KVP_DL_INT = 0, KVP_DL_UINT = 1, KVP_DL_FLOAT = 2,
       KVP_DL_BFLOAT = 4 };                         /* DLDataTypeCode */

typedef struct {
	int32_t device_type; /* DLDeviceType: an enum, int-sized */
	int32_t device_id;
} kvp_dl_device;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} kvp_dl_dtype;

typedef struct {
	void *data;
	kvp_dl_device device;
	int32_t ndim;
	kvp_dl_dtype dtype;
	int64_t *shape;
	int64_t *strides;  /* in elements */
	uint64_t byte_offset;
} kvp_dl_tensor;

typedef struct kvp_dl_managed {
	kvp_dl_tensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct kvp_dl_managed *self);
} kvp_dl_managed;

typedef struct {
	uint32_t major;
	uint32_t minor;
} kvp_dl_version;

#define KVP_DL_FLAG_READ_ONLY (1ull << 0)

typedef struct kvp_dl_managed_v {
	kvp_dl_version version;
	void *manager_ctx;
	void (*deleter)(struct kvp_dl_managed_v *self);
	uint64_t flags;
	kvp_dl_tensor dl_tensor;
} kvp_dl_managed_v;

#endif /* KVPOOL_DLPACK_ABI_H */
