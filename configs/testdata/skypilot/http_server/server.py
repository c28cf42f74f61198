# In the shape of SkyPilot's examples/serve/http_server/server.py: a plain HTTP server with a
# health endpoint, binding every address on a fixed port as such servers do.
import argparse
import http.server


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\n" if self.path == "/health" else b"<html>Hi, SkyPilot here!</html>\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=8080)
args = parser.parse_args()
http.server.ThreadingHTTPServer(("0.0.0.0", args.port), Handler).serve_forever()
