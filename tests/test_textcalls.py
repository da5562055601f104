"""Text tool-call recovery: calls written as text become real calls, prose stays prose."""

import json

from ollie.textcalls import recover_tool_calls

KNOWN = ["execute_code", "read_file"]


def args_of(call):
    return json.loads(call.arguments)


def test_bare_json_object_is_a_call():
    text = '{"name": "execute_code", "arguments": {"code": "echo hi"}}'
    rest, calls = recover_tool_calls(text, KNOWN)
    assert rest == ""
    assert [(c.name, args_of(c)) for c in calls] == [("execute_code", {"code": "echo hi"})]
    assert calls[0].id.startswith("call_")


def test_json_in_a_fence_after_prose_keeps_the_prose():
    text = 'Let me run it.\n```json\n{"name": "read_file", "parameters": {"path": "a.txt"}}\n```'
    rest, calls = recover_tool_calls(text, KNOWN)
    assert rest == "Let me run it."
    assert calls[0].name == "read_file" and args_of(calls[0]) == {"path": "a.txt"}


def test_openai_function_shape_with_string_arguments():
    text = '{"type": "function", "function": {"name": "execute_code", "arguments": "{\\"code\\": \\"ls\\"}"}}'
    _, calls = recover_tool_calls(text, KNOWN)
    assert args_of(calls[0]) == {"code": "ls"}


def test_tool_call_tags_several_calls_in_order():
    text = (
        'Sure.\n<tool_call>\n{"name": "execute_code", "arguments": {"code": "a"}}\n</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "b"}}</tool_call>'
    )
    rest, calls = recover_tool_calls(text, KNOWN)
    assert rest == "Sure."
    assert [c.name for c in calls] == ["execute_code", "read_file"]
    assert calls[0].id != calls[1].id


def test_unclosed_tag_at_the_end_still_counts():
    _, calls = recover_tool_calls('<tool_call>{"name": "execute_code", "arguments": {"code": "x"}}', KNOWN)
    assert [c.name for c in calls] == ["execute_code"]


def test_deepseek_dsml_with_typed_parameters():
    text = (
        'I\'ll check.\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="execute_code">\n'
        '<｜DSML｜parameter name="code" string="true">echo 42</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="timeout" string="false">5</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
    )
    rest, calls = recover_tool_calls(text, KNOWN)
    assert rest == "I'll check."
    assert args_of(calls[0]) == {"code": "echo 42", "timeout": 5}


def test_dsml_tool_calls_variant_with_ascii_bars():
    text = (
        '<|DSML|tool_calls><|DSML|invoke name="read_file"><|DSML|parameter name="path">x.txt</|DSML|parameter>'
        "</|DSML|invoke></|DSML|tool_calls>"
    )
    _, calls = recover_tool_calls(text, KNOWN)
    assert [(c.name, args_of(c)) for c in calls] == [("read_file", {"path": "x.txt"})]


def test_ids_are_stable_across_calls():
    text = '{"name": "execute_code", "arguments": {"code": "echo hi"}}'
    assert recover_tool_calls(text, KNOWN)[1][0].id == recover_tool_calls(text, KNOWN)[1][0].id


def test_prose_mentioning_a_tool_is_left_alone():
    text = 'You could use execute_code with {"code": "ls"} to list files, or read_file.'
    assert recover_tool_calls(text, KNOWN) == (text, [])


def test_unknown_tool_names_are_left_alone():
    for text in (
        '{"name": "delete_everything", "arguments": {}}',
        '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
        '<｜DSML｜function_calls><｜DSML｜invoke name="nope"></｜DSML｜invoke></｜DSML｜function_calls>',
    ):
        assert recover_tool_calls(text, KNOWN) == (text, [])


def test_json_that_only_has_a_name_is_data_not_a_call():
    for text in ('{"name": "execute_code"}', '{"name": "execute_code", "arguments": {}, "author": "me"}'):
        assert recover_tool_calls(text, KNOWN) == (text, [])


def test_no_known_tools_means_no_calls():
    text = '{"name": "execute_code", "arguments": {}}'
    assert recover_tool_calls(text, []) == (text, [])
