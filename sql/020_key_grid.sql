-- key_grid(walk, stride): planning's key pass (pgtrain.data.key_order.grid_walk) in one call. walk is an open
-- NO SCROLL cursor over a source's keys in key order (its unique key index, read alone); the function moves it to
-- the end and returns the keys (in their text form) at positions 1, stride, stride + 1, 2 stride, 2 stride + 1, ...
-- (the global batch grid, which does not depend on the row count) and the number of rows it passed. Moving a
-- cursor sends nothing and sorts nothing; here each move is a PL/pgSQL statement instead of one SQL statement of a
-- client's query string, which costs a parse and a plan each (about 13,000 a plan at 2M rows).
CREATE OR REPLACE FUNCTION pgtrain.key_grid(walk refcursor, stride bigint, OUT keys text[], OUT row_count bigint)
LANGUAGE plpgsql AS $$
DECLARE
    key text;
    moved bigint;
BEGIN
    IF stride < 2 THEN
        RAISE EXCEPTION 'key_grid: stride must be at least 2, not %', stride;
    END IF;
    keys := '{}';
    row_count := 0;
    FETCH walk INTO key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    keys := keys || key;
    row_count := 1;
    LOOP
        IF stride > 2 THEN  -- MOVE FORWARD 0 would not move: it stays on the current row
            MOVE FORWARD stride - 2 FROM walk;
            GET DIAGNOSTICS moved = ROW_COUNT;
            row_count := row_count + moved;
        END IF;
        FETCH walk INTO key;
        EXIT WHEN NOT FOUND;
        keys := keys || key;
        row_count := row_count + 1;
        FETCH walk INTO key;
        EXIT WHEN NOT FOUND;
        keys := keys || key;
        row_count := row_count + 1;
    END LOOP;
END $$;
