import assert from "node:assert/strict";
import { test } from "node:test";
import { en, format, stringsFor, zhCN } from "../src/strings.js";

test("a language tag picks English or Simplified Chinese", () => {
  for (const lang of ["zh-CN", "zh", "zh-Hans", "zh-Hans-CN", "zh-SG", "ZH-cn"]) assert.equal(stringsFor(lang), zhCN, lang);
  for (const lang of ["en", "en-GB", "fr", "", "zh-TW", "zh-Hant"]) assert.equal(stringsFor(lang), en, lang);
});

test("both sets name every string", () => {
  assert.deepEqual(Object.keys(zhCN).sort(), Object.keys(en).sort());
  for (const [key, value] of Object.entries(zhCN)) assert.ok(value.length > 0, key);
});

test("placeholders are filled, unknown ones left", () => {
  assert.equal(format(en.newItem, { title: "Build <b>failed</b>" }), "New notification: Build <b>failed</b>");
  assert.equal(format(zhCN.bellUnseen, { count: 3 }), "通知，3 条未查看");
  assert.equal(format("{x} {y}", { x: 1 }), "1 {y}");
});
