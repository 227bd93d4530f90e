# Multi-stage build of the manager, the agent and the in-pod shim. The build stage is `make build`, the
# same command developers run, so the image holds exactly what the tests exercised.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The agent uses go-nvml through cgo (it dlopens libnvidia-ml.so at run time; nothing links against it here).
RUN make build BIN=/out

# The manager needs nothing from the host.
FROM gcr.io/distroless/base-debian12:nonroot AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

# The agent runs privileged on GPU nodes; the NVIDIA container toolkit injects libnvidia-ml.so, nvidia-smi
# and nvidia-cuda-mps-control. The shim ships in the same image; the DaemonSet's init container copies it
# to the host (/usr/lib/gpusharing), from where the device plugin mounts it into pods.
FROM debian:bookworm-slim AS agent
COPY --from=build /out/agent /agent
COPY --from=build /src/shim/build/libgpushare.so /opt/gpusharing/libgpushare.so
ENTRYPOINT ["/agent"]
