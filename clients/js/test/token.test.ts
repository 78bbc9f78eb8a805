import assert from "node:assert/strict";
import { test } from "node:test";
import { NotifyError } from "../src/errors.js";
import { TokenSource, readClaims } from "../src/token.js";
import { jwt } from "./fakes.js";

test("the claims are read from the base64url payload", () => {
  const claims = readClaims(jwt({ sub: "9007199254740993", exp: 1_900_000_000, name: "ü?>>" }));
  assert.equal(claims.sub, "9007199254740993");
  assert.equal(claims.exp, 1_900_000_000);
});

test("a token without sub and exp is refused as token_malformed", () => {
  for (const token of ["opaque", "a.b.c", jwt({ sub: "42" }), jwt({ exp: 5 })]) {
    assert.throws(() => readClaims(token), (e: unknown) => e instanceof NotifyError && e.code === "token_malformed", token);
  }
});

/** A source whose provider signs a token of the given lifetime at the fake time. */
function source(lifetimeSecs: number) {
  let now = 1_800_000_000_000;
  let calls = 0;
  const tokens = new TokenSource(async () => {
    calls++;
    const iat = Math.floor(now / 1000);
    return jwt({ sub: "42", iat, exp: iat + lifetimeSecs, n: calls });
  }, () => now);
  return { tokens, calls: () => calls, at: (ms: number) => (now += ms) };
}

test("an hour's token is reused until 60 s before it expires, then replaced", async () => {
  const { tokens, calls, at } = source(3600);
  const first = await tokens.token();
  at(3_539_000);
  assert.equal(await tokens.token(), first, "61 s before exp: still the cached token");
  assert.equal(calls(), 1);
  at(2_000);
  const second = await tokens.token();
  assert.notEqual(second, first, "59 s before exp: a new token");
  assert.equal(calls(), 2);
});

test("a short token is replaced a tenth of its lifetime before it expires", async () => {
  const { tokens, calls, at } = source(300);
  await tokens.token();
  at(269_000);
  await tokens.token();
  assert.equal(calls(), 1, "31 s before exp of a 5-minute token: cached");
  at(2_000);
  await tokens.token();
  assert.equal(calls(), 2, "29 s before exp: replaced");
});

test("concurrent callers share one provider call, and refresh() always asks again", async () => {
  const { tokens, calls } = source(3600);
  const [a, b, c] = await Promise.all([tokens.token(), tokens.token(), tokens.userId()]);
  assert.equal(a, b);
  assert.equal(c, "42");
  assert.equal(calls(), 1);
  assert.notEqual(await tokens.refresh(), a);
  assert.equal(calls(), 2);
});

test("a failing provider is reported as token_provider, and the next call tries again", async () => {
  let fail = true;
  const tokens = new TokenSource(async () => {
    if (fail) throw new Error("signed out");
    return jwt({ sub: "1", exp: 4_000_000_000 });
  });
  await assert.rejects(tokens.token(), (e: unknown) => e instanceof NotifyError && e.code === "token_provider" && e.message === "signed out");
  fail = false;
  assert.equal(await tokens.userId(), "1");
});

test("a malformed token fails that call only: the next call asks the provider again", async () => {
  const answers = ["not-a-jwt", jwt({ sub: "7", exp: 4_000_000_000 })];
  let calls = 0;
  const tokens = new TokenSource(async () => answers[calls++]!);
  await assert.rejects(tokens.token(), (e: unknown) => e instanceof NotifyError && e.code === "token_malformed");
  assert.equal(await tokens.token(), answers[1]);
  assert.equal(await tokens.userId(), "7");
  assert.equal(calls, 2);
});

test("a provider that throws at once (not a rejected promise) is token_provider too, and is asked again", async () => {
  let fail = true;
  const tokens = new TokenSource((() => {
    if (fail) throw new Error("no session");
    return Promise.resolve(jwt({ sub: "1", exp: 4_000_000_000 }));
  }) as () => Promise<string>);
  await assert.rejects(tokens.refresh(), (e: unknown) => e instanceof NotifyError && e.code === "token_provider" && e.message === "no session");
  fail = false;
  assert.equal(await tokens.userId(), "1");
});
