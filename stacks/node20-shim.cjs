// cdktn-cli 0.24 wants Node >= 22.19; on Node 20 only undici's call to
// worker_threads.markAsUncloneable (Node >= 22.10) is missing. This no-op stands in for
// it: NODE_OPTIONS="--require ./stacks/node20-shim.cjs" cdktn synth. Remove with Node 22.
const wt = require("node:worker_threads");
if (typeof wt.markAsUncloneable !== "function") wt.markAsUncloneable = () => {};
