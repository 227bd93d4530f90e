#!/usr/bin/env python3
"""Record every MIG GPU instance profile and its possible placements as NVML reports them, without
changing anything on the GPU (MIG mode stays as it is, no instance is created).

Prints one JSON document (agent/gpu/nvmlmock/recordings/README.md describes it): per GPU its identity,
MIG mode, and for every GPU_INSTANCE_PROFILE_* type the profile info NVML answers (nvmlDeviceGetGpuInstanceProfileInfo
and, for the profile's own name, ...InfoV version 2), the possible placements
(nvmlDeviceGetGpuInstancePossiblePlacements_v2) and the return code of each call. Calls that need MIG
mode enabled (the GPU instances that exist, the remaining capacity, the MIG device count) are made too,
read-only: their return codes under "migModeCalls", so the recording says which answers MIG mode withholds,
and the counts of those that succeeded under "migModeValues".

Usage (repository root, on the GPU machine):
  python3 test/gpu/mig/record.py > agent/gpu/nvmlmock/recordings/<model>.json
"""
import ctypes
import json
import sys

GPU_INSTANCE_PROFILE_COUNT = 18  # nvml.h NVML_GPU_INSTANCE_PROFILE_COUNT (driver 580)
TYPE_NAMES = ["1_SLICE", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE", "8_SLICE", "6_SLICE", "1_SLICE_REV1",
              "2_SLICE_REV1", "1_SLICE_REV2", "1_SLICE_GFX", "2_SLICE_GFX", "4_SLICE_GFX", "1_SLICE_NO_ME",
              "2_SLICE_NO_ME", "1_SLICE_ALL_ME", "2_SLICE_ALL_ME", "3_SLICE_GFX"]
RETURNS = {0: "SUCCESS", 1: "ERROR_UNINITIALIZED", 2: "ERROR_INVALID_ARGUMENT", 3: "ERROR_NOT_SUPPORTED",
           4: "ERROR_NO_PERMISSION", 6: "ERROR_NOT_FOUND", 7: "ERROR_INSUFFICIENT_SIZE",
           13: "ERROR_FUNCTION_NOT_FOUND", 19: "ERROR_IN_USE", 25: "ERROR_ARGUMENT_VERSION_MISMATCH",
           999: "ERROR_UNKNOWN"}


class ProfileInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("id", "isP2pSupported", "sliceCount", "instanceCount",
                                             "multiprocessorCount", "copyEngineCount", "decoderCount",
                                             "encoderCount", "jpegCount", "ofaCount")] + [("memorySizeMB", ctypes.c_ulonglong)]


class ProfileInfoV2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in ("version", "id", "isP2pSupported", "sliceCount", "instanceCount",
                                             "multiprocessorCount", "copyEngineCount", "decoderCount",
                                             "encoderCount", "jpegCount", "ofaCount")] + [
        ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96)]


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def ret(r):
    return RETURNS.get(r, f"ERROR_{r}")


def main():
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    r = nvml.nvmlInit_v2()
    if r != 0:
        sys.exit(f"nvmlInit_v2: {ret(r)}")
    try:
        buf = ctypes.create_string_buffer(96)
        nvml.nvmlSystemGetDriverVersion(buf, 96)
        driver = buf.value.decode()
        cuda = ctypes.c_int()
        nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda))
        count = ctypes.c_uint()
        nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        out = {"recordedBy": "test/gpu/mig/record.py", "driverVersion": driver,
               "cudaVersion": f"{cuda.value // 1000}.{(cuda.value % 1000) // 10}", "devices": []}
        for i in range(count.value):
            out["devices"].append(device(nvml, i))
    finally:
        nvml.nvmlShutdown()
    json.dump(out, sys.stdout, indent=1)
    print()


def device(nvml, index):
    h = ctypes.c_void_p()
    r = nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h))
    if r != 0:
        return {"index": index, "return": ret(r)}
    buf = ctypes.create_string_buffer(96)
    nvml.nvmlDeviceGetName(h, buf, 96)
    name = buf.value.decode()
    nvml.nvmlDeviceGetUUID(h, buf, 96)
    uuid = buf.value.decode()
    mem = Memory()
    nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem))
    cur, pend = ctypes.c_uint(), ctypes.c_uint()
    r = nvml.nvmlDeviceGetMigMode(h, ctypes.byref(cur), ctypes.byref(pend))
    dev = {"index": index, "product": name, "uuid": uuid, "memoryBytes": mem.total,
           "migMode": {"return": ret(r), "current": cur.value == 1, "pending": pend.value == 1},
           "profiles": [], "migModeCalls": {}}
    values = {}

    def call(name, r, count):
        dev["migModeCalls"][name] = ret(r)
        if r == 0:
            values[name] = count.value

    maxmig = ctypes.c_uint()
    call("nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount(h, ctypes.byref(maxmig)), maxmig)
    for t in range(GPU_INSTANCE_PROFILE_COUNT):
        info = ProfileInfo()
        r = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, t, ctypes.byref(info))
        p = {"type": t, "typeName": TYPE_NAMES[t], "return": ret(r)}
        if r == 0:
            p.update({f: getattr(info, f) for f, _ in ProfileInfo._fields_})
            v2 = ProfileInfoV2(version=ctypes.sizeof(ProfileInfoV2) | (2 << 24))
            rv = nvml.nvmlDeviceGetGpuInstanceProfileInfoV(h, t, ctypes.byref(v2))
            p["nameReturn"] = ret(rv)
            if rv == 0:
                p["name"] = v2.name.decode()
            pls = (Placement * 32)()
            n = ctypes.c_uint(32)
            rp = nvml.nvmlDeviceGetGpuInstancePossiblePlacements_v2(h, info.id, pls, ctypes.byref(n))
            p["placementsReturn"] = ret(rp)
            p["placements"] = [{"start": pls[k].start, "size": pls[k].size} for k in range(n.value)] if rp == 0 else []
            left = ctypes.c_uint()
            call(f"nvmlDeviceGetGpuInstanceRemainingCapacity({info.id})",
                 nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id, ctypes.byref(left)), left)
            gis = (ctypes.c_void_p * 8)()
            gn = ctypes.c_uint()
            call(f"nvmlDeviceGetGpuInstances({info.id})", nvml.nvmlDeviceGetGpuInstances(h, info.id, gis, ctypes.byref(gn)), gn)
        dev["profiles"].append(p)
    dev["migModeValues"] = values
    return dev


if __name__ == "__main__":
    main()
