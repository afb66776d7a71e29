/* SPDX-License-Identifier: MIT */
/*
 * gpu_report.h - what the two halves of `kvbench gpu` share: bench_gpu.c
 * runs the measurements on the GPU (built only with CUDA), gpu_report.c
 * parses the options and prints the results (a table, or one JSON object).
 */
#ifndef KVBENCH_GPU_REPORT_H
#define KVBENCH_GPU_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvbench.h"
#include "kvpool.h"

/* HSTU: 2 KiB rows, 1 MiB pages. */
#define GPU_DEFAULT_LAYOUT \
	"layers=8,kv_heads=4,head_dim=256,dtype=bf16,page_tokens=32"
/* 512-byte rows (a Llama-like model with 2 KV heads), always measured too. */
#define GPU_SMALL_ROWS_LAYOUT \
	"layers=32,kv_heads=2,head_dim=128,dtype=bf16,page_tokens=16"

/* Users per launch of the latency part. */
#define GPU_LAT_BATCHES 4
extern const uint32_t gpu_lat_users[GPU_LAT_BATCHES]; /* 1, 8, 64, 512 */

struct gpu_opts {
	struct kvp_layout layout;
	struct kvp_layout small; /* GPU_SMALL_ROWS_LAYOUT */
	uint64_t mib;            /* the append pool and the offload/onload bytes */
	uint64_t reps;
	uint64_t samples;        /* latency samples per batch size */
	uint64_t device;
	bool json;
};

/* One append geometry: the kernel against a d2d cudaMemcpy of its bytes. */
struct gpu_append {
	struct kvp_layout l;
	uint64_t pages;
	uint64_t tokens;
	uint64_t bytes;          /* tokens * token_bytes: what one append moves */
	double gbps;             /* medians, counting read + written (2 * bytes) */
	double layers_gbps;      /* kvp_append_layers_cuda */
	double pages_gbps;       /* kvp_append_cuda, pages shuffled, slots in order */
	double d2d_gbps;
	double *gbps_all;        /* every repetition, in run order */
	double *layers_gbps_all;
	double *pages_gbps_all;
	double *d2d_gbps_all;
	bool verified;           /* pool read back == the C reference */
	bool layers_verified;
};

/* Offload and onload through the engine on the cuda backend. */
struct gpu_xfer {
	uint64_t users;
	uint64_t pages;
	uint64_t bytes;          /* pages * page_bytes, each way */
	double offload_gbps;     /* medians */
	double onload_gbps;
	double seq_gbps;         /* offload then onload: 2 * bytes / (t_off + t_on) */
	double bidir_gbps;       /* onload of half the users and offload of the
				  * others issued back to back: bytes / t */
	double raw_d2h_gbps;     /* one cudaMemcpyAsync of all the bytes */
	double raw_h2d_gbps;
	double raw_d2h_page_gbps; /* one cudaMemcpyAsync per page */
	double raw_h2d_page_gbps;
	double raw_bidir_gbps;   /* half each way at once, two streams */
	double *offload_all;
	double *onload_all;
	bool counters_ok;        /* bytes_d2h / bytes_h2d moved by exactly bytes */
};

struct gpu_latency {
	double p50_us[GPU_LAT_BATCHES];
	double p99_us[GPU_LAT_BATCHES];
	double d2d_p50_us[GPU_LAT_BATCHES]; /* cudaMemcpyAsync of the same bytes */
	uint64_t samples;
};

struct gpu_machine {
	char name[256];
	char driver[64];         /* the kernel module's version, else "" */
	int cuda_driver;         /* cudaDriverGetVersion: 13000 = 13.0 */
	int cuda_runtime;
	int cc_major, cc_minor;
	int sms;
	uint64_t memory_bytes;
	char pci_bus_id[32];
};

struct gpu_results {
	struct gpu_machine gpu;
	struct kvb_machine host;
	struct gpu_append append;
	struct gpu_append small;
	struct gpu_xfer xfer;
	struct gpu_latency lat;
};

/* Parse argv into *o; returns -1 to go on, else the exit status. */
int gpu_parse_opts(int argc, char **argv, struct gpu_opts *o);

#ifdef KVPOOL_HAVE_CUDA
/*
 * Run everything on o->device into *r (bench_gpu.c). Returns KVB_EXIT_OK,
 * KVB_EXIT_FAIL (after a message: no GPU, a CUDA or engine error, a failed
 * check: the results are then still printed when they were measured) or
 * KVB_EXIT_USAGE (sizes this GPU cannot hold). *measured says whether the
 * results can be printed.
 */
int gpu_measure(const struct gpu_opts *o, struct gpu_results *r, bool *measured);
void gpu_results_free(struct gpu_results *r);
void gpu_print_json(const struct gpu_opts *o, const struct gpu_results *r);
void gpu_print_table(const struct gpu_opts *o, const struct gpu_results *r);
#endif

#endif /* KVBENCH_GPU_REPORT_H */
