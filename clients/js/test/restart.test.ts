import assert from "node:assert/strict";
import { test } from "node:test";
import { restarts } from "../src/component/restart.js";

test("setting a connection property to the same value does not reconnect", () => {
  const provider = async () => "t";
  const object = {};
  assert.equal(restarts("getToken", provider, provider), false);
  assert.equal(restarts("client", object, object), false);
  assert.equal(restarts("store", object, object), false);
  assert.equal(restarts("store", null, null), false);
});

test("a new token provider over another is swapped in; setting or clearing one, or a new client or store, reconnects", () => {
  assert.equal(restarts("getToken", async () => "a", async () => "b"), false, "a re-render's new arrow");
  assert.equal(restarts("getToken", null, async () => "a"), true);
  assert.equal(restarts("getToken", async () => "a", null), true);
  assert.equal(restarts("client", {}, {}), true);
  assert.equal(restarts("store", null, {}), true);
});
