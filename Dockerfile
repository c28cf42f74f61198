# Multi-stage build of Ferry's one static binary.
#   docker build -t ferry .
#   docker run --rm -p 8000:8000 ferry proxy --listen 0.0.0.0:8000 --replica http://vllm:8000
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" -o /out/ferry ./cmd/ferry

# Local replicas run their setup/run through bash, so the runtime image keeps a shell; the
# binary itself is static and needs nothing else.
FROM debian:bookworm-slim
RUN useradd --create-home --uid 10001 ferry
COPY --from=build /out/ferry /usr/local/bin/ferry
USER ferry
ENV FERRY_HOME=/home/ferry/.ferry
ENTRYPOINT ["/usr/local/bin/ferry"]
CMD ["--help"]
