// Node preload for tests/s3/s3rver-put-race: every fs.write / fs.writev to an
// s3rver object file (…._S3rver_object) starts 30 ms late, as when node's
// thread pool is busy under a loaded machine. It widens the window in which
// an unpatched s3rver has answered a PutObject but not yet written its bytes.
'use strict';
const fs = require('fs');
const DELAY_MS = 30;
const objectFds = new Set();

const open = fs.open;
fs.open = function (path, ...rest) {
  const cb = rest[rest.length - 1];
  if (typeof cb === 'function') {
    rest[rest.length - 1] = (err, fd) => {
      if (!err && String(path).endsWith('._S3rver_object')) objectFds.add(fd);
      cb(err, fd);
    };
  }
  return open.call(fs, path, ...rest);
};
const close = fs.close;
fs.close = function (fd, ...rest) {
  objectFds.delete(fd);
  return close.call(fs, fd, ...rest);
};
for (const name of ['write', 'writev']) {
  const real = fs[name];
  fs[name] = function (fd, ...rest) {
    if (!objectFds.has(fd)) return real.call(fs, fd, ...rest);
    setTimeout(() => real.call(fs, fd, ...rest), DELAY_MS);
  };
}
