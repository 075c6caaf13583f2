/* A stand-in for the CUDA driver and CUPTI, for tests on machines without a GPU.
 *
 * Built twice by tests/recording/cuda_capture.rs, as libcuda.so.1 and as libcupti.so, and found through
 * LD_LIBRARY_PATH. It implements the few calls highwater makes at session start and inside its
 * callback, with results the test sets, and lets the test deliver callback records to the
 * subscriber exactly as CUPTI would: on the calling thread, one record at a time.
 */
#include <stddef.h>
#include <stdint.h>

typedef void (*callback_fn)(void *userdata, int domain, uint32_t cbid, const void *data);

static int init_result = 0;
static int device_count = 1;
static size_t memory_free = 0;
static size_t memory_total = 0;
static uint64_t reserved = 0;
static int subscribe_result = 0;
static callback_fn subscriber = NULL;
static int subscribed = 0;
static uint32_t enabled = 0;

/* What the test sets. */
void stub_set_init_result(int result) { init_result = result; }
void stub_set_device_count(int count) { device_count = count; }
void stub_set_memory(size_t free, size_t total) { memory_free = free; memory_total = total; }
void stub_set_reserved(uint64_t bytes) { reserved = bytes; }
void stub_set_subscribe_result(int result) { subscribe_result = result; }
int stub_subscribed(void) { return subscribed; }
uint32_t stub_enabled(void) { return enabled; }

/* Delivers one driver-API record to the subscriber, as CUPTI does inside the call. */
int stub_deliver(uint32_t cbid, const void *record) {
    if (!subscribed || subscriber == NULL) return 0;
    subscriber(NULL, 1 /* CUPTI_CB_DOMAIN_DRIVER_API */, cbid, record);
    return 1;
}

/* The driver. */
int cuInit(unsigned flags) { (void)flags; return init_result; }
int cuDeviceGetCount(int *count) { *count = device_count; return 0; }
int cuMemGetInfo_v2(size_t *free, size_t *total) {
    *free = memory_free;
    *total = memory_total;
    return memory_total == 0 ? 201 /* CUDA_ERROR_INVALID_CONTEXT */ : 0;
}
int cuDeviceGetMemPool(void **pool, int device) {
    *pool = (void *)(uintptr_t)(0x9000 + device);
    return 0;
}
int cuMemPoolGetAttribute(void *pool, int attribute, void *value) {
    (void)pool;
    if (attribute != 5 /* CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT */) return 1;
    *(uint64_t *)value = reserved;
    return 0;
}

/* CUPTI. */
int cuptiSubscribe(void **handle, callback_fn callback, void *userdata) {
    (void)userdata;
    if (subscribe_result != 0) return subscribe_result;
    if (subscribed) return 39; /* CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED */
    subscriber = callback;
    subscribed = 1;
    *handle = (void *)&subscriber;
    return 0;
}
int cuptiEnableCallback(uint32_t enable, void *handle, int domain, uint32_t cbid) {
    (void)handle; (void)domain; (void)cbid;
    if (enable) enabled++;
    return 0;
}
int cuptiUnsubscribe(void *handle) {
    (void)handle;
    subscribed = 0;
    subscriber = NULL;
    return 0;
}
int cuptiGetDeviceId(void *context, uint32_t *device) {
    if (context == NULL) return 1;
    /* Contexts are the test's: 0x100 + ordinal. */
    *device = (uint32_t)((uintptr_t)context - 0x100);
    return 0;
}
