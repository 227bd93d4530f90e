# Multi-stage build of the manager, the agent and the in-pod shim. The build stage is `make build`, the
# same command developers run, so the image holds exactly what the tests exercised.
#
# The bases are tags, which move. A release pins each by digest through these arguments (docs/security.md,
# supply chain), e.g. --build-arg GOLANG_IMAGE=golang:1.26-bookworm@sha256:<digest>, the digest read from
# the registry with `crane digest golang:1.26-bookworm` or `docker buildx imagetools inspect`.
ARG GOLANG_IMAGE=golang:1.26-bookworm
ARG MANAGER_BASE=gcr.io/distroless/base-debian12:nonroot
ARG AGENT_BASE=debian:bookworm-slim

FROM ${GOLANG_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The agent uses go-nvml through cgo (it dlopens libnvidia-ml.so at run time; nothing links against it here).
RUN make build BIN=/out

# The manager needs nothing from the host.
FROM ${MANAGER_BASE} AS manager
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

# The agent runs privileged on GPU nodes; the NVIDIA container toolkit injects libnvidia-ml.so, nvidia-smi
# and nvidia-cuda-mps-control. The shim ships in the same image; the DaemonSet's init container copies it
# to the host (/usr/lib/gpusharing), from where the device plugin mounts it into pods.
FROM ${AGENT_BASE} AS agent
COPY --from=build /out/agent /agent
COPY --from=build /src/shim/build/libgpushare.so /opt/gpusharing/libgpushare.so
ENTRYPOINT ["/agent"]
