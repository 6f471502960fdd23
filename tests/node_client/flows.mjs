// The official openai Node SDK's request flows against the OpenAI frontend at argv[2], unchanged: each flow's
// facts printed as one JSON object, which tests/server/test_openai_node_sdk.py checks.
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const client = new OpenAI({ baseURL: `${process.argv[2]}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const ask = [{ role: 'user', content: 'Hello' }];
const out = {};

async function failure(call) {
  try {
    await call();
    return null;
  } catch (error) {
    return { kind: error.constructor.name, status: error.status, code: error.code, param: error.param,
             requestID: error.requestID };
  }
}

const models = await client.models.list();
out.models = models.data.map((model) => model.id);

const whole = await client.chat.completions.create({ model: 'llm', messages: ask, max_tokens: 6, seed: 1 });
out.whole = { text: whole.choices[0].message.content, usage: whole.usage, requestID: whole._request_id };

let text = '';
let usage = null;
const stream = await client.chat.completions.create({
  model: 'llm', messages: ask, max_tokens: 6, seed: 1, stream: true, stream_options: { include_usage: true } });
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? '';
  usage = chunk.usage ?? usage;
}
out.streamed = { text, usage };
out.helper = (await client.chat.completions.stream({ model: 'llm', messages: ask, max_tokens: 6, seed: 1 })
  .finalChatCompletion()).choices[0].message.content;

const rag = await client.chat.completions.create({
  model: 'rag', messages: [{ role: 'user', content: 'How is the KV cache divided into blocks?' }], max_tokens: 8 });
out.ragSources = rag.choices[0].message.sources.map((source) => source.source);

// zod v4 writes a format and its own pattern for these; the answer is parsed (validated) by zod itself
const Event = z.object({ at: z.iso.datetime(), day: z.iso.date(), time: z.iso.time(), id: z.uuid(), host: z.ipv4() });
const parsed = await client.chat.completions.parse({
  model: 'llm', messages: ask, response_format: zodResponseFormat(Event, 'event'), max_tokens: 400, seed: 2 });
out.parsed = parsed.choices[0].message.parsed;

const book = zodFunction({ name: 'book', parameters: z.object({ id: z.uuid(), day: z.iso.date() }) });
const called = await client.chat.completions.parse({
  model: 'llm', messages: ask, tools: [book], tool_choice: 'required', max_tokens: 300, seed: 3 });
const calls = called.choices[0].message.tool_calls;
out.toolCalls = calls.map((call) => ({ id: call.id, name: call.function.name, parsed: call.function.parsed_arguments }));
const next = await client.chat.completions.create({
  model: 'llm', max_tokens: 4, tools: [book], messages: [...ask, called.choices[0].message,
    ...calls.map((call) => ({ role: 'tool', tool_call_id: call.id, content: 'booked' }))] });
out.afterTools = next.choices[0].finish_reason;

const texts = ['paged attention', 'a KV cache block'];
const packed = await client.embeddings.create({ model: 'embed', input: texts });   // base64 asked, decoded by the SDK
const floats = await client.embeddings.create({ model: 'embed', input: texts, encoding_format: 'float' });
out.embeddings = {
  dims: packed.data[0].embedding.length,
  maxDifference: Math.max(...packed.data.flatMap((item, i) => item.embedding.map(
    (value, j) => Math.abs(value - floats.data[i].embedding[j])))),
};

out.notFound = await failure(() => client.chat.completions.create({ model: 'nosuch', messages: ask }));
out.badRequest = await failure(() => client.chat.completions.create({ model: 'llm', messages: ask, temperature: -1 }));

const controller = new AbortController();
const long = await client.chat.completions.create(
  { model: 'llm', messages: ask, max_tokens: 1500, ignore_eos: true, stream: true }, { signal: controller.signal });
let chunks = 0;
for await (const _ of long) {
  if (++chunks === 3) controller.abort();   // the loop then ends without an error, as the SDK does
}
out.abortedAfter = chunks;

console.log(JSON.stringify(out));
