/*
 * test_meminfo: what every memory query reports, for each visible device (or only --device
 * when given): cuMemGetInfo_v2 free/total (with the device's primary context current),
 * cuDeviceTotalMem_v2, and NVML nvmlDeviceGetMemoryInfo / _v2 (matched by UUID) when NVML loads.
 *
 * Output per device (one line each):
 *   device=D name=NAME uuid=GPU-... driver_version=V
 *   device=D meminfo_free= meminfo_total= meminfo_used= device_total_mem=
 *   device=D nvml_total= nvml_free= nvml_used=            (or nvml_result=ERROR)
 *   device=D nvml_v2_total= nvml_v2_reserved= nvml_v2_free= nvml_v2_used= (or nvml_v2_result=)
 * and devices=N.
 */
#include <string.h>

#include "gpu.h"

static void report(int ordinal, int driver_version)
{
    CUdevice dev;
    CUcontext ctx;
    char name[256];
    CUuuid uuid;
    char uuid_s[64];
    CHECK(cuDeviceGet(&dev, ordinal));
    CHECK(cuDeviceGetName(name, (int)sizeof name, dev));
    CHECK(cuDeviceGetUuid_v2(&uuid, dev));
    for (char *p = name; *p; p++)
        if (*p == ' ')
            *p = '_';
    format_uuid(&uuid, uuid_s);
    out("device=%d name=%s uuid=%s driver_version=%d\n", ordinal, name, uuid_s, driver_version);

    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    size_t mfree = 0, mtotal = 0, dtotal = 0;
    meminfo(&mfree, &mtotal);
    CHECK(cuDeviceTotalMem_v2(&dtotal, dev));
    out("device=%d meminfo_free=%zu meminfo_total=%zu meminfo_used=%zu device_total_mem=%zu\n",
        ordinal, mfree, mtotal, mtotal - mfree, dtotal);

    nvmlDevice_t nd;
    if (nvml_device(&uuid, ordinal, &nd)) {
        nvmlMemory_t m;
        int rc = nvml_memory(nd, &m);
        if (rc == 0)
            out("device=%d nvml_total=%llu nvml_free=%llu nvml_used=%llu\n", ordinal, m.total,
                m.free, m.used);
        else
            out("device=%d nvml_result=\"%s\"\n", ordinal, nvml_error(rc));
        nvmlMemory_v2_t m2;
        rc = nvml_memory_v2(nd, &m2);
        if (rc == 0)
            out("device=%d nvml_v2_total=%llu nvml_v2_reserved=%llu nvml_v2_free=%llu "
                "nvml_v2_used=%llu\n",
                ordinal, m2.total, m2.reserved, m2.free, m2.used);
        else
            out("device=%d nvml_v2_result=\"%s\"\n", ordinal, nvml_error(rc));
    } else if (nvml_open()) {
        out("device=%d nvml_result=\"no NVML device with this UUID or index\"\n", ordinal);
    }
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
}

int main(int argc, char **argv)
{
    int only = 0;
    for (int i = 1; i < argc; i++)
        only |= !strncmp(argv[i], "--device", 8);
    parse_opts(argc, argv, NULL, "Print every memory query, for each device.");
    CHECK(cuInit(0));
    int count = 0, version = 0;
    CHECK(cuDeviceGetCount(&count));
    CHECK(cuDriverGetVersion(&version));
    if (only && opt_device >= count)
        die("device %d requested but only %d visible", opt_device, count);
    for (int d = only ? opt_device : 0; d < (only ? opt_device + 1 : count); d++)
        report(d, version);
    out("devices=%d\n", count);
    return 0;
}
