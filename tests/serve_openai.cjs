// serve_openai.cjs - the official OpenAI client (npm `openai`, installed
// into the build tree by tests/npm_openai.sh) against `llmem serve`.
//
//   node serve_openai.cjs NPMDIR PORT basic
//       models.list; completions and chat, streamed and not (the streamed
//       text equals the non-streamed one); an error the client raises as
//       APIError 400; 16 concurrent streaming clients with different
//       prompts and lengths, each getting exactly what it got alone.
//   node serve_openai.cjs NPMDIR PORT chatml
//       a ChatML model: the rendered prompt (prompt_token_ids) equals the
//       template by hand, streamed and not; chat equals a completion of it.
//   node serve_openai.cjs NPMDIR PORT greedy EXPECT_FILE
//       EXPECT_FILE lines: "PROMPT_JSON<TAB>STEPS<TAB>IDS" (IDS: what
//       `llmem run -t 0 -n STEPS --print-ids` printed: BOS, the prompt,
//       the output: STEPS + 1 ids); the server's greedy completion of STEPS + 1 - P tokens
//       (P: its prompt_tokens), streamed and not, must give the same
//       output ids (return_token_ids, an extension the client passes
//       through as an extra body field).
'use strict';
const [npmdir, port, mode, expectFile] = process.argv.slice(2);
const OpenAI = require(npmdir + '/node_modules/openai');
const fs = require('fs');

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
let failures = 0;
function check(cond, what) {
  if (!cond) {
    failures++;
    console.error('serve_openai: FAIL: ' + what);
  }
}

async function streamCompletion(params) {
  const s = await client.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  let ids = null;
  for await (const chunk of s) {
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
      if (c.token_ids) ids = c.token_ids;
    }
  }
  return { text, finish, ids };
}

async function basic() {
  const models = await client.models.list();
  check(models.data.length === 1, 'models.list has one model');
  const model = models.data[0].id;

  const p = { model, prompt: 'hello world', max_tokens: 24, temperature: 0 };
  const c = await client.completions.create(p);
  check(c.object === 'text_completion' && c.choices.length === 1, 'completion shape');
  check(c.usage && c.usage.completion_tokens === 24 && c.usage.prompt_tokens > 0, 'completion usage');
  const s = await streamCompletion(p);
  check(s.text === c.choices[0].text, `streamed text equals the non-streamed one ('${s.text}' / '${c.choices[0].text}')`);
  check(s.finish === 'length', 'stream finish_reason');

  const msgs = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hi.' }];
  const chat = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0 });
  check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant', 'chat shape');
  check(chat.usage && chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'chat usage');
  const cs = await client.chat.completions.create({ model, messages: msgs, max_tokens: 16, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let ctext = '', role = null, usage = null;
  for await (const chunk of cs) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) ctext += ch.delta.content;
    }
  }
  check(role === 'assistant', 'chat stream role');
  check(ctext === chat.choices[0].message.content, 'streamed chat text equals the non-streamed one');
  check(usage && usage.completion_tokens === chat.usage.completion_tokens, 'chat stream usage');

  // The client raises the server's error object.
  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x' });
    check(false, 'an unknown model raised no error');
  } catch (e) {
    check(e instanceof OpenAI.APIError && e.status === 400, `unknown model: APIError 400 (got ${e.status} ${e})`);
    check(e.code === 'model_not_found', 'unknown model: code');
  }

  // 16 concurrent streams, different prompts and lengths: each alone first.
  const jobs = [];
  for (let i = 0; i < 16; i++)
    jobs.push({ model, prompt: `story ${i}: ` + 'once '.repeat(i % 5), max_tokens: 8 + 5 * i, temperature: 0 });
  const alone = [];
  for (const j of jobs) alone.push(await streamCompletion(j));
  const together = await Promise.all(jobs.map((j) => streamCompletion(j)));
  for (let i = 0; i < 16; i++) {
    check(together[i].text === alone[i].text, `concurrent stream ${i} differs from its run alone`);
    check(together[i].finish === alone[i].finish, `concurrent stream ${i} finish reason`);
  }
}

async function greedy() {
  const lines = fs.readFileSync(expectFile, 'utf8').split('\n').filter((l) => l.length);
  const models = await client.models.list();
  const model = models.data[0].id;
  for (const line of lines) {
    const [pj, steps, idsText] = line.split('\t');
    const prompt = JSON.parse(pj);
    const full = idsText.trim().split(/ +/).map(Number);
    const probe = await client.completions.create({ model, prompt, max_tokens: 1, temperature: 0 });
    const P = probe.usage.prompt_tokens;
    check(P >= 1 && P <= full.length, `prompt ${JSON.stringify(prompt)}: ${P} tokens`);
    const want = full.slice(P);
    // llmem run prints STEPS + 1 tokens counting BOS (as run.c).
    const params = { model, prompt, max_tokens: Number(steps) + 1 - P, temperature: 0, return_token_ids: true };
    const c = await client.completions.create(params);
    const got = c.choices[0].token_ids;
    check(Array.isArray(got) && JSON.stringify(got) === JSON.stringify(want),
      `greedy ${JSON.stringify(prompt)}: server ids ${JSON.stringify(got)} differ from llmem run's ${JSON.stringify(want)}`);
    const s = await streamCompletion(params);
    check(JSON.stringify(s.ids) === JSON.stringify(want), `greedy stream ${JSON.stringify(prompt)}: ids differ`);
    check(s.text === c.choices[0].text, `greedy stream ${JSON.stringify(prompt)}: text differs`);
  }
  console.log(`serve_openai: ${lines.length} prompts equal to llmem run, token for token`);
}

// A ChatML model (llmem synth --chat-template chatml: the made-up
// vocabulary, <|im_start|> and <|im_end|> its last two ids): the prompt the
// server rendered equals the template rendered here by hand, streamed and
// not, and the chat answer equals a completion of those very ids.
async function chatml() {
  const models = await client.models.list();
  const model = models.data[0].id;
  const V = 32000, imStart = V - 2, imEnd = V - 1;
  // No spaces in the messages: one token a character (newline: <0x0A>).
  const text = (s) => [...s].map((ch) => (ch === '\n' ? 13 : 259 + ch.charCodeAt(0) - 32));
  const msgs = [{ role: 'system', content: 'Terse.' }, { role: 'user', content: 'Why?' }];
  let want = [];
  for (const m of msgs) want = want.concat([imStart], text(m.role + '\n' + m.content), [imEnd], text('\n'));
  want = want.concat([imStart], text('assistant\n'));
  const p = { model, messages: msgs, max_tokens: 8, temperature: 0, return_token_ids: true };
  const chat = await client.chat.completions.create(p);
  check(JSON.stringify(chat.prompt_token_ids) === JSON.stringify(want),
    `chatml prompt ${JSON.stringify(chat.prompt_token_ids)} differs from the template by hand ${JSON.stringify(want)}`);
  check(chat.usage.prompt_tokens === want.length, 'chatml usage.prompt_tokens');
  const cs = await client.chat.completions.create({ ...p, stream: true, stream_options: { include_usage: true } });
  let ctext = '', sprompt = null, susage = null, sids = null;
  for await (const chunk of cs) {
    if (chunk.usage) {
      susage = chunk.usage;
      sprompt = chunk.prompt_token_ids;
    }
    for (const ch of chunk.choices) {
      if (ch.delta.content) ctext += ch.delta.content;
      if (ch.token_ids) sids = ch.token_ids;
    }
  }
  check(JSON.stringify(sprompt) === JSON.stringify(want), 'chatml stream: prompt_token_ids');
  check(ctext === chat.choices[0].message.content, 'chatml stream: text equals the non-streamed one');
  check(JSON.stringify(sids) === JSON.stringify(chat.choices[0].token_ids), 'chatml stream: token_ids');
  check(susage && susage.completion_tokens === chat.usage.completion_tokens, 'chatml stream: usage');
  const c = await client.completions.create({ model, prompt: want, max_tokens: 8, temperature: 0, return_token_ids: true });
  check(JSON.stringify(c.choices[0].token_ids) === JSON.stringify(chat.choices[0].token_ids) &&
    c.choices[0].text === chat.choices[0].message.content, 'chatml: the completion of the rendered ids answers as the chat');
}

(mode === 'greedy' ? greedy() : mode === 'chatml' ? chatml() : basic())
  .then(() => {
    if (failures) process.exit(1);
    console.log('serve_openai: ' + mode + ': all checks passed');
  })
  .catch((e) => {
    console.error('serve_openai: FAIL: ' + (e && e.stack ? e.stack : e));
    process.exit(1);
  });
