// Preload: make the test server (server.listen(port)) bind to 127.0.0.1 only.
const net = require('net')
const orig = net.Server.prototype.listen
net.Server.prototype.listen = function (...args) {
  if ((typeof args[0] === 'number' || typeof args[0] === 'string') && /^\d+$/.test(String(args[0])) && (args.length === 1 || typeof args[1] === 'function')) {
    args.splice(1, 0, '127.0.0.1')
  }
  return orig.apply(this, args)
}
