"""A logging proxy: every request body to a JSON-lines file, forwarded to the server."""
import http.server, json, sys, urllib.request, urllib.error

TARGET, LOG = sys.argv[2], sys.argv[3]

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _go(self, method):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else None
        with open(LOG, "a") as f:
            f.write(json.dumps({"method": method, "path": self.path,
                                "body": json.loads(body) if body else None}) + "\n")
        req = urllib.request.Request(TARGET + self.path, data=body, method=method)
        for k in ("content-type", "authorization", "accept"):
            if self.headers.get(k):
                req.add_header(k, self.headers[k])
        try:
            r = urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            r = e
        data = r.read()
        with open(LOG + ".out", "ab") as f:
            f.write(f"--- {method} {self.path} {r.status}\n".encode() + data + b"\n")
        self.send_response(r.status)
        self.send_header("content-type", r.headers.get("content-type", "application/json"))
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self._go("GET")
    def do_POST(self): self._go("POST")
    def do_DELETE(self): self._go("DELETE")
    def log_message(self, *a): pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
