// The OpenAI Node client's own examples (function calling, streamed tool calls, structured
// outputs), unchanged in shape, against `anvil serve`. tests/proto/openai_client_test.cpp starts
// the servers and runs:
//   node examples.mjs tools URL        a model whose chat template has tools (Qwen2.5's); it calls
//                                      get_weather for Paris, France
//   node examples.mjs structured URL   the shipped model with a ChatML template
// Prints "ok: <mode>" and exits 0 when every check holds; otherwise the first failure and exits 1.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [mode, baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const model = 'anvil';

// The function-calling guide's tool.
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get current temperature for a given location.',
      parameters: {
        type: 'object',
        properties: {
          location: { type: 'string', description: 'City and country e.g. Bogotá, Colombia' },
        },
        required: ['location'],
        additionalProperties: false,
      },
      strict: true,
    },
  },
];

function getWeather(location) {
  return location.startsWith('Paris') ? 14 : 20;
}

async function toolExamples() {
  // 1. The model asks for a call; the client reads message.tool_calls.
  const messages = [{ role: 'user', content: 'What is the weather like in Paris today?' }];
  const completion = await client.chat.completions.create({ model, messages, tools });
  const message = completion.choices[0].message;
  assert.equal(completion.choices[0].finish_reason, 'tool_calls');
  assert.equal(message.tool_calls.length, 1);
  const toolCall = message.tool_calls[0];
  assert.equal(toolCall.type, 'function');
  assert.equal(toolCall.function.name, 'get_weather');
  const args = JSON.parse(toolCall.function.arguments);
  assert.equal(args.location, 'Paris, France');

  // 2. The result goes back as a tool message, after the assistant's message as the client got it.
  messages.push(message);
  messages.push({ role: 'tool', tool_call_id: toolCall.id, content: getWeather(args.location).toString() });
  const second = await client.chat.completions.create({ model, messages, tools });
  assert.ok(second.choices[0].message.role === 'assistant');
  assert.ok(second.usage.prompt_tokens > completion.usage.prompt_tokens);

  // 3. Streamed: the guide's accumulation of tool-call deltas by index.
  const stream = await client.chat.completions.create({ model, messages: messages.slice(0, 1), tools, stream: true });
  const finalToolCalls = {};
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    for (const toolCallDelta of choice.delta.tool_calls || []) {
      const { index } = toolCallDelta;
      if (!finalToolCalls[index]) {
        finalToolCalls[index] = toolCallDelta;
      } else {
        finalToolCalls[index].function.arguments += toolCallDelta.function.arguments;
      }
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(finalToolCalls[0].function.name, 'get_weather');
  assert.equal(JSON.parse(finalToolCalls[0].function.arguments).location, 'Paris, France');

  // 4. The client's stream helper assembles the same message from the deltas.
  const runner = client.chat.completions.stream({ model, messages: messages.slice(0, 1), tools });
  const assembled = await runner.finalChatCompletion();
  assert.equal(assembled.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(assembled.choices[0].message.tool_calls[0].function.arguments), { location: 'Paris, France' });

  // 5. tool_choice forces a call with valid arguments, whatever the model would rather write.
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const forced = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'Say hello.' }],
      tools,
      tool_choice,
      parallel_tool_calls: false,
      max_tokens: 100,
    });
    const call = forced.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.equal(typeof JSON.parse(call.function.arguments).location, 'string');
  }

  // 6. What anvil does not support is a 400 the client raises, naming the field.
  await assert.rejects(
    client.chat.completions.create({ model, messages, tools, modalities: ['text', 'audio'] }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && /modalities/.test(err.message),
  );
}

// The structured-outputs guide's event extraction; strings and the list are bounded so that the
// small shipped model ends them within max_tokens.
const calendarEvent = {
  type: 'json_schema',
  json_schema: {
    name: 'calendar_event',
    strict: true,
    schema: {
      type: 'object',
      properties: {
        name: { type: 'string', maxLength: 40 },
        date: { type: 'string', maxLength: 20 },
        participants: { type: 'array', items: { type: 'string', maxLength: 20 }, maxItems: 3 },
      },
      required: ['name', 'date', 'participants'],
      additionalProperties: false,
    },
  },
};

function checkEvent(event) {
  assert.deepEqual(Object.keys(event), ['name', 'date', 'participants']);
  assert.equal(typeof event.name, 'string');
  assert.ok(event.name.length <= 40);
  assert.ok(Array.isArray(event.participants) && event.participants.length <= 3);
  for (const p of event.participants) assert.equal(typeof p, 'string');
}

async function structuredExamples() {
  const messages = [
    { role: 'system', content: 'Extract the event information.' },
    { role: 'user', content: 'Alice and Bob are going to a science fair on Friday.' },
  ];
  for (const temperature of [0, 1]) {
    const completion = await client.chat.completions.create({
      model,
      messages,
      response_format: calendarEvent,
      temperature,
      seed: 7,
      max_tokens: 400,
    });
    assert.equal(completion.choices[0].finish_reason, 'stop');
    checkEvent(JSON.parse(completion.choices[0].message.content));
  }

  // The client's parse() helper parses the content itself.
  const parsed = await client.chat.completions.parse({ model, messages, response_format: calendarEvent, max_tokens: 400 });
  checkEvent(parsed.choices[0].message.parsed);

  // Streamed, the pieces join into the same kind of document.
  const stream = await client.chat.completions.create({
    model,
    messages,
    response_format: calendarEvent,
    max_tokens: 400,
    stream: true,
  });
  let content = '';
  for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? '';
  checkEvent(JSON.parse(content));

  // JSON mode: an object, whatever the model prefers.
  const jsonMode = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: 'Reply in JSON.' }],
    response_format: { type: 'json_object' },
    max_tokens: 400,
  });
  if (jsonMode.choices[0].finish_reason === 'stop') {
    assert.equal(typeof JSON.parse(jsonMode.choices[0].message.content), 'object');
  } else {
    assert.equal(jsonMode.choices[0].finish_reason, 'length');
  }

  // A schema anvil cannot enforce is a 400 naming response_format, never free text.
  await assert.rejects(
    client.chat.completions.create({
      model,
      messages,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: { type: 'string' } } } },
    }),
    (err) => err.status === 400 && err.param === 'response_format',
  );
}

try {
  if (mode === 'tools') await toolExamples();
  else if (mode === 'structured') await structuredExamples();
  else throw new Error(`unknown mode ${mode}`);
  console.log(`ok: ${mode}`);
} catch (err) {
  console.log(`FAIL: ${mode}: ${err.stack || err}`);
  process.exit(1);
}
