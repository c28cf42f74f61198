# Ferry's one static binary, in two images:
#
#   docker build -t ferry .                  # default: the binary alone on scratch, for Kubernetes
#                                            # and cloud replicas (charts/ferry runs this one)
#   docker build --target local -t ferry:local .   # with bash, for a controller whose replicas
#                                            # run on the `local` infra inside its container
#
#   docker run --rm -p 8000:8000 ferry proxy --listen 0.0.0.0:8000 --replica http://vllm:8000
#
# grpcnotrace drops grpc's golang.org/x/net/trace, whose html/template makes the linker keep every
# exported method of every reachable type (the EC2 client's ~800 operations, client-go's informer
# factories): the stripped binary goes from 113 MB to 57 MB (docs/kubernetes.md, "Image").
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/ferry ./cmd/ferry
# The scratch image's whole filesystem besides the binary: CA roots for the cloud and Kubernetes
# APIs, a passwd entry so the non-root user has a name and a home, and writable /tmp and FERRY_HOME.
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/ferry/.ferry \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && echo 'ferry:x:10001:10001:ferry:/home/ferry:/sbin/nologin' > /rootfs/etc/passwd \
 && echo 'ferry:x:10001:' > /rootfs/etc/group \
 && chmod 1777 /rootfs/tmp

# Local replicas run their setup/run through bash, so this image keeps a shell.
FROM debian:bookworm-slim AS local
RUN useradd --create-home --uid 10001 ferry
COPY --from=build /out/ferry /usr/local/bin/ferry
USER ferry
ENV FERRY_HOME=/home/ferry/.ferry
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["--help"]

# The default: no shell, no package manager, nothing but the static binary and the files above.
FROM scratch
COPY --from=build /rootfs/etc /etc
COPY --from=build /rootfs/tmp /tmp
COPY --from=build --chown=10001:10001 /rootfs/home/ferry /home/ferry
COPY --from=build /out/ferry /usr/local/bin/ferry
USER 10001:10001
ENV FERRY_HOME=/home/ferry/.ferry HOME=/home/ferry
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["--help"]
