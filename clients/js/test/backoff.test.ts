import assert from "node:assert/strict";
import { test } from "node:test";
import { backoffDelay } from "../src/backoff.js";

test("each delay lies between half and all of its ceiling, which doubles from 1 s to the 30 s cap", () => {
  const ceilings = [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000];
  ceilings.forEach((ceiling, attempt) => {
    assert.equal(backoffDelay(attempt, { random: () => 0 }), ceiling / 2, `attempt ${attempt} low end`);
    assert.ok(Math.abs(backoffDelay(attempt, { random: () => 0.999999 }) - ceiling) < 1, `attempt ${attempt} high end`);
    for (let i = 0; i < 200; i++) {
      const delay = backoffDelay(attempt);
      assert.ok(delay >= ceiling / 2 && delay <= ceiling, `attempt ${attempt}: ${delay} outside [${ceiling / 2}, ${ceiling}]`);
    }
  });
  assert.equal(backoffDelay(1_000, { random: () => 1 }), 30_000, "a huge attempt stays at the cap");
});

test("delays are jittered: the same attempt does not always wait the same", () => {
  const delays = new Set(Array.from({ length: 50 }, () => backoffDelay(3)));
  assert.ok(delays.size > 40, `only ${delays.size} distinct delays of 50`);
});

test("base and cap are options", () => {
  assert.equal(backoffDelay(0, { baseMs: 200, random: () => 0 }), 100);
  assert.equal(backoffDelay(10, { baseMs: 200, capMs: 5_000, random: () => 1 }), 5_000);
});
